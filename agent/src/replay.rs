//! Replay rings: the bounded history of one output channel of a process, addressed by
//! absolute byte offset, so a reader can ask for "everything after byte N".
//!
//! A ring keeps the output as the `Bytes` chunks its pump read (tiny reads are merged, so a
//! chatty terminal does not leave thousands of small chunks). It retains about `capacity`
//! bytes; older bytes are forgotten, and a reader that asks for them is told which range was
//! lost ([`Read::Dropped`]) before it gets what follows. Output is never lost silently.
//!
//! Backpressure: while readers are attached, the writer may not run more than `capacity`
//! bytes ahead of the slowest one ([`Ring::room`] waits), so a slow client slows the process
//! down (its pipe fills and its writes block) instead of losing output. With no reader
//! attached the writer never waits: the ring overwrites its oldest bytes.

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use tether_proto::ByteOffset;
use tokio::sync::Notify;

/// A chunk shorter than this is merged into a short predecessor: 16 KiB. Bounds the number
/// of chunks a ring of terminal output holds to about `2 * capacity / MERGE_BELOW`.
const MERGE_BELOW: usize = 16 << 10;

/// The history of one output channel.
#[derive(Debug)]
pub struct Ring {
    state: Mutex<State>,
    /// Woken when bytes are appended or the ring closes.
    data: Notify,
    /// Woken when a reader advances or detaches, which may make room for the writer.
    room: Notify,
}

#[derive(Debug)]
struct State {
    /// Retained chunks, oldest first, each with the offset of its first byte.
    chunks: VecDeque<(ByteOffset, Bytes)>,
    /// Offset of the oldest retained byte.
    start: ByteOffset,
    /// Offset one past the newest byte: how many bytes were ever written.
    end: ByteOffset,
    capacity: u64,
    /// The writer is done: readers that reach `end` are finished.
    closed: bool,
    /// Attached readers and the offset each will read next. Never below `start`.
    readers: Vec<(u64, ByteOffset)>,
    next_reader: u64,
}

/// What a reader gets next.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// Bytes starting at the reader's offset.
    Data(Bytes),
    /// Bytes `from..to` were overwritten before this reader got them; it continues at `to`.
    Dropped {
        /// First lost offset.
        from: ByteOffset,
        /// First offset still available.
        to: ByteOffset,
    },
    /// The channel ended and the reader has everything.
    End,
}

impl Ring {
    /// An empty ring retaining about `capacity` bytes.
    pub fn new(capacity: usize) -> Ring {
        Ring {
            state: Mutex::new(State {
                chunks: VecDeque::new(),
                start: 0,
                end: 0,
                capacity: capacity.max(1) as u64,
                closed: false,
                readers: Vec::new(),
                next_reader: 0,
            }),
            data: Notify::new(),
            room: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("replay ring lock")
    }

    /// How many bytes were ever written.
    pub fn end(&self) -> ByteOffset {
        self.lock().end
    }

    /// Waits until the writer may append, then returns how many bytes it may append:
    /// `usize::MAX` when no reader is attached.
    pub async fn room(&self) -> usize {
        loop {
            let mut notified = pin!(self.room.notified());
            notified.as_mut().enable();
            if let Some(room) = self.lock().room() {
                return room;
            }
            notified.await;
        }
    }

    /// Appends `chunk`, forgetting the oldest bytes beyond capacity that no attached reader
    /// still needs.
    pub fn push(&self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        self.lock().push(chunk);
        self.data.notify_waiters();
    }

    /// Marks the end of the channel.
    pub fn close(&self) {
        self.lock().closed = true;
        self.data.notify_waiters();
    }

    /// Attaches a reader that wants the bytes from offset `from` on. `None` when `from` is past
    /// the end of what was written. A reader asking for forgotten bytes first gets
    /// [`Read::Dropped`]; [`Reader::offset`] then already says where its data starts.
    pub fn attach(self: &Arc<Self>, from: ByteOffset) -> Option<Reader> {
        let mut state = self.lock();
        if from > state.end {
            return None;
        }
        let id = state.next_reader;
        state.next_reader += 1;
        let offset = from.max(state.start);
        state.readers.push((id, offset));
        Some(Reader {
            ring: self.clone(),
            id,
            offset,
            lost_from: (from < offset).then_some(from),
        })
    }
}

impl State {
    fn min_reader(&self) -> Option<ByteOffset> {
        self.readers.iter().map(|&(_, offset)| offset).min()
    }

    fn room(&self) -> Option<usize> {
        match self.min_reader() {
            None => Some(usize::MAX),
            Some(min) => {
                let ahead = self.end - min;
                (ahead < self.capacity).then(|| (self.capacity - ahead) as usize)
            }
        }
    }

    fn push(&mut self, chunk: Bytes) {
        let len = chunk.len();
        match self.chunks.back_mut() {
            Some((_, last)) if last.len() < MERGE_BELOW && len < MERGE_BELOW => {
                let mut merged = BytesMut::with_capacity(last.len() + len);
                merged.extend_from_slice(last);
                merged.extend_from_slice(&chunk);
                *last = merged.freeze();
            }
            _ => self.chunks.push_back((self.end, chunk)),
        }
        self.end += len as u64;
        self.trim();
    }

    /// Forgets bytes older than `end - capacity`, but none an attached reader has not read.
    fn trim(&mut self) {
        let mut keep = self.end.saturating_sub(self.capacity);
        if let Some(min) = self.min_reader() {
            keep = keep.min(min);
        }
        if keep <= self.start {
            return;
        }
        while let Some((offset, chunk)) = self.chunks.front_mut() {
            let chunk_end = *offset + chunk.len() as u64;
            if chunk_end <= keep {
                self.chunks.pop_front();
            } else {
                if *offset < keep {
                    let _ = chunk.split_to((keep - *offset) as usize);
                    *offset = keep;
                }
                break;
            }
        }
        self.start = keep;
    }

    fn read(&self, offset: ByteOffset, max: usize) -> Option<Read> {
        if offset < self.start {
            return Some(Read::Dropped {
                from: offset,
                to: self.start,
            });
        }
        if offset >= self.end {
            return self.closed.then_some(Read::End);
        }
        let index = self
            .chunks
            .partition_point(|(start, chunk)| start + chunk.len() as u64 <= offset);
        let (start, chunk) = &self.chunks[index];
        let skip = (offset - start) as usize;
        let len = (chunk.len() - skip).min(max.max(1));
        Some(Read::Data(chunk.slice(skip..skip + len)))
    }

    fn set_reader(&mut self, id: u64, offset: ByteOffset) {
        if let Some(entry) = self.readers.iter_mut().find(|(r, _)| *r == id) {
            entry.1 = offset;
        }
    }
}

/// An attached reader. While it lives, the ring keeps every byte from its offset on, and the
/// writer waits rather than run more than a ring's capacity ahead of it.
#[derive(Debug)]
pub struct Reader {
    ring: Arc<Ring>,
    id: u64,
    offset: ByteOffset,
    /// Where the reader asked to start, when those bytes were already forgotten.
    lost_from: Option<ByteOffset>,
}

impl Reader {
    /// The offset of the next byte this reader will get.
    pub fn offset(&self) -> ByteOffset {
        self.offset
    }

    /// Waits for what comes next, at most `max` bytes of data. Data is not consumed until
    /// [`Self::advance`] says it was delivered.
    pub async fn read(&mut self, max: usize) -> Read {
        let ring = self.ring.clone();
        loop {
            let mut notified = pin!(ring.data.notified());
            notified.as_mut().enable();
            if let Some(read) = self.try_read(max) {
                return read;
            }
            notified.await;
        }
    }

    /// What comes next if it is there already.
    pub fn try_read(&mut self, max: usize) -> Option<Read> {
        if let Some(from) = self.lost_from.take() {
            return Some(Read::Dropped {
                from,
                to: self.offset,
            });
        }
        let mut state = self.ring.lock();
        let read = state.read(self.offset, max)?;
        if let Read::Dropped { to, .. } = read {
            self.offset = to;
            state.set_reader(self.id, to);
        }
        Some(read)
    }

    /// Records that `n` bytes from the reader's offset were delivered.
    pub fn advance(&mut self, n: usize) {
        self.offset += n as u64;
        self.ring.lock().set_reader(self.id, self.offset);
        self.ring.room.notify_waiters();
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.ring.lock().readers.retain(|(r, _)| *r != self.id);
        self.ring.room.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    fn ring(capacity: usize) -> Arc<Ring> {
        Arc::new(Ring::new(capacity))
    }

    /// Reads everything currently available, asserting there is no gap.
    fn drain(reader: &mut Reader) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(Read::Data(bytes)) = reader.try_read(usize::MAX) {
            out.extend_from_slice(&bytes);
            reader.advance(bytes.len());
        }
        out
    }

    #[test]
    fn reads_from_any_retained_offset() {
        let r = ring(1 << 20);
        r.push(Bytes::from_static(b"hello "));
        r.push(Bytes::from(vec![b'x'; MERGE_BELOW]));
        r.push(Bytes::from_static(b"world"));
        assert_eq!(r.end(), 11 + MERGE_BELOW as u64);
        let mut reader = r.attach(3).unwrap();
        assert_eq!(reader.offset(), 3);
        let got = drain(&mut reader);
        assert_eq!(&got[..3], b"lo ");
        assert_eq!(&got[got.len() - 5..], b"world");
        assert_eq!(got.len(), 8 + MERGE_BELOW);
        assert!(r.attach(r.end() + 1).is_none());
        assert!(r.attach(r.end()).is_some());
    }

    #[test]
    fn reads_respect_max() {
        let r = ring(100);
        r.push(Bytes::from_static(b"abcdef"));
        let mut reader = r.attach(1).unwrap();
        assert_eq!(
            reader.try_read(2),
            Some(Read::Data(Bytes::from_static(b"bc")))
        );
        // Not advanced: the same bytes again.
        assert_eq!(
            reader.try_read(2),
            Some(Read::Data(Bytes::from_static(b"bc")))
        );
    }

    #[test]
    fn overflow_reports_the_dropped_range_then_continues() {
        let r = ring(10);
        for chunk in [&b"0123456789"[..], b"abcdefghij", b"ABCDE"] {
            r.push(Bytes::copy_from_slice(chunk));
        }
        // 25 bytes written, 10 kept: 15..25.
        let mut reader = r.attach(0).unwrap();
        assert_eq!(reader.offset(), 15);
        assert_eq!(
            reader.try_read(100),
            Some(Read::Dropped { from: 0, to: 15 })
        );
        assert_eq!(drain(&mut reader), b"fghijABCDE");
        r.close();
        assert_eq!(reader.try_read(100), Some(Read::End));
    }

    #[test]
    fn wraps_around_many_times_keeping_exactly_capacity() {
        let r = ring(1000);
        let mut all = Vec::new();
        for i in 0..500u32 {
            let chunk: Vec<u8> = (0..(i % 97 + 1)).map(|j| (i + j) as u8).collect();
            all.extend_from_slice(&chunk);
            r.push(Bytes::from(chunk));
        }
        let end = r.end();
        assert_eq!(end, all.len() as u64);
        let mut reader = r.attach(end - 1000).unwrap();
        assert_eq!(drain(&mut reader), &all[all.len() - 1000..]);
        let mut early = r.attach(end - 1001).unwrap();
        assert_eq!(
            early.try_read(10),
            Some(Read::Dropped {
                from: end - 1001,
                to: end - 1000
            })
        );
    }

    #[test]
    fn small_chunks_are_merged() {
        let r = ring(1 << 20);
        for _ in 0..10_000 {
            r.push(Bytes::from_static(b"x"));
        }
        let chunks = r.lock().chunks.len();
        assert!(chunks <= 2, "{chunks} chunks");
        let mut reader = r.attach(0).unwrap();
        assert_eq!(drain(&mut reader).len(), 10_000);
    }

    #[test]
    fn without_readers_the_writer_never_waits() {
        let r = ring(10);
        assert_eq!(r.room().now_or_never(), Some(usize::MAX));
        r.push(Bytes::from(vec![0; 100]));
        assert_eq!(r.room().now_or_never(), Some(usize::MAX));
    }

    #[test]
    fn an_attached_reader_holds_the_writer_back() {
        let r = ring(10);
        let mut reader = r.attach(0).unwrap();
        assert_eq!(r.room().now_or_never(), Some(10));
        r.push(Bytes::from_static(b"0123456"));
        assert_eq!(r.room().now_or_never(), Some(3));
        r.push(Bytes::from_static(b"789"));
        assert_eq!(r.room().now_or_never(), None, "full: the writer must wait");

        let mut waiting = Box::pin(r.room());
        assert!((&mut waiting).now_or_never().is_none());
        let Some(Read::Data(bytes)) = reader.try_read(4) else {
            panic!("data expected")
        };
        assert_eq!(&bytes[..], b"0123");
        reader.advance(4);
        assert_eq!(waiting.now_or_never(), Some(4));

        // Detaching releases the writer entirely.
        drop(reader);
        assert_eq!(r.room().now_or_never(), Some(usize::MAX));
    }

    #[test]
    fn unread_bytes_survive_a_push_beyond_capacity() {
        // A writer that read more than it had room for (a reader attached meanwhile)
        // must not trim what that reader still needs.
        let r = ring(4);
        let mut reader = r.attach(0).unwrap();
        r.push(Bytes::from_static(b"abcdefgh"));
        assert_eq!(drain(&mut reader), b"abcdefgh");
        drop(reader);
        r.push(Bytes::from_static(b"ij"));
        let mut late = r.attach(0).unwrap();
        assert_eq!(late.try_read(100), Some(Read::Dropped { from: 0, to: 6 }));
        assert_eq!(drain(&mut late), b"ghij");
    }

    #[tokio::test]
    async fn readers_wake_on_data_and_close() {
        let r = ring(100);
        let mut reader = r.attach(0).unwrap();
        let writer = {
            let r = r.clone();
            tokio::spawn(async move {
                r.push(Bytes::from_static(b"hi"));
                r.close();
            })
        };
        assert_eq!(
            reader.read(100).await,
            Read::Data(Bytes::from_static(b"hi"))
        );
        reader.advance(2);
        assert_eq!(reader.read(100).await, Read::End);
        writer.await.unwrap();
    }
}
