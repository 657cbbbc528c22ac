//! [`Buffer`]: the output of one exec session that no poll has acknowledged yet, addressed
//! by the agent's byte offsets, so a poll's cursor is the same number the agent's replay
//! uses. Gaps (output the agent's ring lost while nobody was attached) are remembered so a
//! poll can say what was lost instead of silently skipping it.

use std::collections::VecDeque;

use bytes::Bytes;

/// Unacknowledged output, as the chunks it arrived in.
#[derive(Debug, Default)]
pub(super) struct Buffer {
    /// Chunks and their offsets, in order; offsets jump only across a gap.
    chunks: VecDeque<(u64, Bytes)>,
    /// The offset after the last byte received (or skipped).
    end: u64,
    /// Bytes held in `chunks`.
    held: usize,
}

/// What [`Buffer::read`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Read {
    /// The bytes, from `from`.
    pub bytes: Vec<u8>,
    /// Where they start: the cursor asked for, or later when output there was lost.
    pub from: u64,
}

impl Buffer {
    /// The offset after the last byte received.
    pub(super) fn end(&self) -> u64 {
        self.end
    }

    /// Bytes held, acknowledged by no poll yet.
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// Appends output that starts at the current end.
    pub(super) fn push(&mut self, bytes: Bytes) {
        if bytes.is_empty() {
            return;
        }
        self.held += bytes.len();
        let at = self.end;
        // Offsets come from the sandbox: one near the end of the range must not overflow.
        self.end = self.end.saturating_add(bytes.len() as u64);
        self.chunks.push_back((at, bytes));
    }

    /// Output from the current end up to `to` was lost; the next push starts at `to`.
    pub(super) fn skip_to(&mut self, to: u64) {
        self.end = self.end.max(to);
    }

    /// Forgets everything before `offset`: a poll presented it as its cursor, so the client
    /// has it.
    pub(super) fn ack(&mut self, offset: u64) {
        while let Some((at, bytes)) = self.chunks.front_mut() {
            let chunk_end = at.saturating_add(bytes.len() as u64);
            if chunk_end <= offset {
                self.held -= bytes.len();
                self.chunks.pop_front();
            } else {
                if *at < offset {
                    let cut = (offset - *at) as usize;
                    let _ = bytes.split_to(cut);
                    *at = offset;
                    self.held -= cut;
                }
                break;
            }
        }
    }

    /// Up to `max` bytes from `cursor` on. Output before the first chunk still held (lost,
    /// or acknowledged already) is skipped: `from` says where the bytes really start.
    pub(super) fn read(&self, cursor: u64, max: usize) -> Read {
        let mut out = Vec::new();
        let mut from: Option<u64> = None;
        for (at, bytes) in &self.chunks {
            let chunk_end = at.saturating_add(bytes.len() as u64);
            if chunk_end <= cursor {
                continue;
            }
            let start = match from {
                None => cursor.max(*at),
                Some(f) => {
                    let next = f.saturating_add(out.len() as u64);
                    if *at != next {
                        // A gap between chunks: stop before it, the next read reports it.
                        break;
                    }
                    next
                }
            };
            let skip = (start - at) as usize;
            let take = (bytes.len() - skip).min(max - out.len());
            from.get_or_insert(start);
            out.extend_from_slice(&bytes[skip..skip + take]);
            if out.len() == max {
                break;
            }
        }
        let from = from.unwrap_or(self.end.max(cursor));
        Read { bytes: out, from }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer(parts: &[&str]) -> Buffer {
        let mut b = Buffer::default();
        for p in parts {
            b.push(Bytes::copy_from_slice(p.as_bytes()));
        }
        b
    }

    #[test]
    fn reads_from_a_cursor_across_chunks() {
        let b = buffer(&["hello ", "wide ", "world"]);
        assert_eq!(b.end(), 16);
        assert_eq!(b.read(0, 100).bytes, b"hello wide world");
        assert_eq!(b.read(3, 6).bytes, b"lo wid");
        assert_eq!(b.read(3, 6).from, 3);
        assert_eq!(
            b.read(16, 10),
            Read {
                bytes: vec![],
                from: 16
            }
        );
    }

    #[test]
    fn acks_free_what_the_client_has() {
        let mut b = buffer(&["hello ", "world"]);
        b.ack(3);
        assert_eq!(b.held(), 8);
        assert_eq!(b.read(3, 100).bytes, b"lo world");
        b.ack(6);
        assert_eq!(b.held(), 5);
        // An earlier cursor gets what is still held, and says where it starts.
        assert_eq!(
            b.read(0, 100),
            Read {
                bytes: b"world".to_vec(),
                from: 6
            }
        );
        b.ack(11);
        assert_eq!(b.held(), 0);
        assert_eq!(
            b.read(11, 100),
            Read {
                bytes: vec![],
                from: 11
            }
        );
    }

    #[test]
    fn offsets_from_the_sandbox_cannot_overflow() {
        let mut b = Buffer::default();
        b.skip_to(u64::MAX - 2);
        b.push(Bytes::from_static(b"abcdef"));
        assert_eq!(b.end(), u64::MAX);
        assert_eq!(b.read(u64::MAX - 2, 100).from, u64::MAX - 2);
        b.ack(u64::MAX);
    }

    #[test]
    fn gaps_are_reported_not_bridged() {
        let mut b = buffer(&["abc"]);
        b.skip_to(10);
        b.push(Bytes::from_static(b"xyz"));
        assert_eq!(b.end(), 13);
        assert_eq!(
            b.read(0, 100),
            Read {
                bytes: b"abc".to_vec(),
                from: 0
            }
        );
        assert_eq!(
            b.read(3, 100),
            Read {
                bytes: b"xyz".to_vec(),
                from: 10
            }
        );
        assert_eq!(
            b.read(11, 1),
            Read {
                bytes: b"y".to_vec(),
                from: 11
            }
        );
    }
}
