//! Credit accounting for one direction of one stream.
//!
//! The receiver grants the sender credit in bytes; the sender may have at most that many
//! unacknowledged bytes outstanding. The receiver returns credit as its consumer takes bytes,
//! batched so it sends a window frame per half-window consumed, not per frame.

/// The receiving side's view: how much has been consumed and not yet returned.
#[derive(Debug, Clone)]
pub struct RecvWindow {
    window: u32,
    consumed: u32,
}

impl RecvWindow {
    /// A receiver that granted `window` bytes.
    pub fn new(window: u32) -> RecvWindow {
        RecvWindow {
            window: window.max(1),
            consumed: 0,
        }
    }

    /// Records that the consumer took `n` bytes. Returns the credit to send back, if it is
    /// time to send a window frame.
    pub fn consumed(&mut self, n: usize) -> Option<u32> {
        // Saturating, not `as u32`: a wrapped count would lose credit and stall the sender.
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        self.consumed = self.consumed.saturating_add(n);
        // `> 0` because a 1-byte window's half is 0: an empty read must not produce a window
        // frame of zero credit, which the peer rejects as malformed.
        if self.consumed > 0 && self.consumed >= self.window / 2 {
            Some(std::mem::take(&mut self.consumed))
        } else {
            None
        }
    }
}

/// The sending side's view: how much it may still send.
#[derive(Debug, Clone)]
pub struct SendWindow {
    credit: u64,
}

impl SendWindow {
    /// A sender granted `window` bytes initially.
    pub fn new(window: u32) -> SendWindow {
        SendWindow {
            credit: window as u64,
        }
    }

    /// Bytes it may send now.
    pub fn available(&self) -> u64 {
        self.credit
    }

    /// Records `n` bytes sent. Sending more than is available is a caller bug.
    pub fn spend(&mut self, n: usize) {
        self.credit = self.credit.saturating_sub(n as u64);
    }

    /// Adds credit from a window frame. Credit is capped so a hostile peer cannot overflow it.
    pub fn grant(&mut self, credit: u32) {
        self.credit = (self.credit + credit as u64).min(u32::MAX as u64 * 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_credit_per_half_window() {
        let mut w = RecvWindow::new(100);
        assert_eq!(w.consumed(30), None);
        assert_eq!(w.consumed(30), Some(60));
        assert_eq!(w.consumed(10), None);
    }

    #[test]
    fn spend_and_grant() {
        let mut w = SendWindow::new(10);
        w.spend(7);
        assert_eq!(w.available(), 3);
        w.grant(5);
        assert_eq!(w.available(), 8);
    }
}
