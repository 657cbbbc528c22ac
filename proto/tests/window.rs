//! Flow-control accounting: what `PROTOCOL.md` promises about credit holds for the helpers
//! every party uses.
#![allow(clippy::unwrap_used, reason = "test code; a panic fails the test")]

use tether_proto::limits::{INITIAL_WINDOW, MAX_WINDOW};
use tether_proto::window::{RecvWindow, SendWindow};

#[test]
fn receiver_returns_credit_per_half_window() {
    let mut w = RecvWindow::new(INITIAL_WINDOW);
    let half = INITIAL_WINDOW as usize / 2;
    assert_eq!(w.consumed(half - 1), None);
    assert_eq!(w.consumed(1), Some(half as u32));
    assert_eq!(w.consumed(10), None);
    assert_eq!(w.consumed(half), Some(half as u32 + 10));
}

#[test]
fn receiver_returns_everything_it_was_sent() {
    // Whatever the chunking, the credit returned adds up to the bytes consumed once the
    // stream is drained past a half window: no credit leaks, so the sender never stalls.
    let mut w = RecvWindow::new(1000);
    let mut returned = 0u64;
    for n in [1usize, 333, 7, 499, 160, 1, 999] {
        returned += w.consumed(n).map_or(0, u64::from);
    }
    let consumed: u64 = 1 + 333 + 7 + 499 + 160 + 1 + 999;
    assert_eq!(returned, consumed);
}

#[test]
fn receiver_never_asks_to_send_zero_credit() {
    // A window frame of 0 credit is a protocol error, so `consumed` must not produce one,
    // even for the smallest window or an empty read.
    for window in [0, 1, 2, 3, INITIAL_WINDOW] {
        let mut w = RecvWindow::new(window);
        assert_eq!(w.consumed(0), None, "window {window}");
        assert!(w.consumed(1).is_none_or(|c| c > 0));
        assert_eq!(w.consumed(0), None, "window {window}");
    }
}

#[test]
fn receiver_of_a_one_byte_window_returns_every_byte() {
    let mut w = RecvWindow::new(1);
    for _ in 0..3 {
        assert_eq!(w.consumed(1), Some(1));
    }
}

#[test]
fn sender_spends_and_is_granted() {
    let mut w = SendWindow::new(INITIAL_WINDOW);
    assert_eq!(w.available(), INITIAL_WINDOW as u64);
    w.spend(INITIAL_WINDOW as usize);
    assert_eq!(w.available(), 0);
    w.grant(100);
    w.grant(28);
    assert_eq!(w.available(), 128);
    // Overspending is a caller bug, but it cannot underflow.
    w.spend(1000);
    assert_eq!(w.available(), 0);
}

#[test]
fn sender_credit_is_capped_so_grants_cannot_overflow() {
    let mut w = SendWindow::new(u32::MAX);
    for _ in 0..100 {
        w.grant(u32::MAX);
    }
    let capped = w.available();
    assert!(capped >= MAX_WINDOW as u64);
    w.grant(u32::MAX);
    assert_eq!(w.available(), capped);
}

#[test]
fn a_zero_initial_window_sends_nothing_until_granted() {
    let mut w = SendWindow::new(0);
    assert_eq!(w.available(), 0);
    w.grant(1);
    assert_eq!(w.available(), 1);
}

#[cfg(target_pointer_width = "64")]
#[test]
fn receiver_saturates_instead_of_wrapping() {
    let mut w = RecvWindow::new(INITIAL_WINDOW);
    assert_eq!(w.consumed(u32::MAX as usize + 2), Some(u32::MAX));
}
