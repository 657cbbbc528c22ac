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
use std::ops::Range;
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
pub(crate) struct Ring {
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

/// Where a read gathers the ring's bytes: copied into one buffer ([`BytesMut`]), or kept as
/// the ring's own pieces (`Vec<Bytes>`, no copy: each piece shares the ring's memory).
pub(crate) trait Gather {
    /// Adds `chunk[range]`.
    fn gather(&mut self, chunk: &Bytes, range: Range<usize>);
}

impl Gather for BytesMut {
    fn gather(&mut self, chunk: &Bytes, range: Range<usize>) {
        self.extend_from_slice(&chunk[range]);
    }
}

impl Gather for Vec<Bytes> {
    fn gather(&mut self, chunk: &Bytes, range: Range<usize>) {
        self.push(chunk.slice(range));
    }
}

/// What a reader gets next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Read<B = BytesMut> {
    /// Bytes starting at the reader's offset.
    Data(B),
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
    pub(crate) fn new(capacity: usize) -> Ring {
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
    pub(crate) fn end(&self) -> ByteOffset {
        self.lock().end
    }

    /// Waits until the writer may append, then returns how many bytes it may append:
    /// `usize::MAX` when no reader is attached.
    pub(crate) async fn room(&self) -> usize {
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
    pub(crate) fn push(&self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        self.lock().push(chunk);
        self.data.notify_waiters();
    }

    /// Marks the end of the channel.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.data.notify_waiters();
    }

    /// Attaches a reader that wants the bytes from offset `from` on. `None` when `from` is past
    /// the end of what was written. A reader asking for forgotten bytes first gets
    /// [`Read::Dropped`]; [`Reader::offset`] then already says where its data starts.
    pub(crate) fn attach(self: &Arc<Self>, from: ByteOffset) -> Option<Reader> {
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

    /// What a reader at `offset` gets next: up to `max` bytes copied, across chunk
    /// boundaries, into the buffer `buffer` makes for their exact count (appended to what it
    /// already holds). The caller holds the ring's lock for the copy: a sender asks for one
    /// frame (64 KiB, microseconds), which the pump can wait for.
    fn read<B: Gather>(
        &self,
        offset: ByteOffset,
        max: usize,
        buffer: impl FnOnce(usize) -> B,
    ) -> Option<Read<B>> {
        if offset < self.start {
            return Some(Read::Dropped {
                from: offset,
                to: self.start,
            });
        }
        if offset >= self.end {
            return self.closed.then_some(Read::End);
        }
        let len = ((self.end - offset) as usize).min(max.max(1));
        let mut buf = buffer(len);
        let mut index = self
            .chunks
            .partition_point(|(start, chunk)| start + chunk.len() as u64 <= offset);
        let mut at = offset;
        let stop = offset + len as u64;
        while at < stop {
            let (start, chunk) = &self.chunks[index];
            let skip = (at - start) as usize;
            let take = (chunk.len() - skip).min((stop - at) as usize);
            buf.gather(chunk, skip..skip + take);
            at += take as u64;
            index += 1;
        }
        Some(Read::Data(buf))
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
pub(crate) struct Reader {
    ring: Arc<Ring>,
    id: u64,
    offset: ByteOffset,
    /// Where the reader asked to start, when those bytes were already forgotten.
    lost_from: Option<ByteOffset>,
}

impl Reader {
    /// The offset of the next byte this reader will get.
    pub(crate) fn offset(&self) -> ByteOffset {
        self.offset
    }

    /// Waits for what comes next. Data (up to `max` bytes, across however many chunks the
    /// pump pushed) is gathered into what `buffer` returns for their count: copied into one
    /// buffer, or as the ring's own pieces, which a writer that gathers sends with no copy.
    /// It is not consumed until [`Self::advance`] says it was delivered.
    pub(crate) async fn read_into<B: Gather>(
        &mut self,
        max: usize,
        buffer: impl Fn(usize) -> B,
    ) -> Read<B> {
        let ring = self.ring.clone();
        loop {
            let mut notified = pin!(ring.data.notified());
            notified.as_mut().enable();
            if let Some(read) = self.try_read_into(max, &buffer) {
                return read;
            }
            notified.await;
        }
    }

    /// What comes next if it is there already; see [`Self::read_into`].
    pub(crate) fn try_read_into<B: Gather>(
        &mut self,
        max: usize,
        buffer: impl Fn(usize) -> B,
    ) -> Option<Read<B>> {
        if let Some(from) = self.lost_from.take() {
            return Some(Read::Dropped {
                from,
                to: self.offset,
            });
        }
        let mut state = self.ring.lock();
        let read = state.read(self.offset, max, buffer)?;
        if let Read::Dropped { to, .. } = read {
            self.offset = to;
            state.set_reader(self.id, to);
        }
        Some(read)
    }

    /// Records that `n` bytes from the reader's offset were delivered.
    pub(crate) fn advance(&mut self, n: usize) {
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
mod tests;
