//! The local terminal: whether a descriptor is one, its size, and raw mode (or echo off, for
//! secrets) held by a guard that restores the previous settings however the command ends
//! (return, error, panic, or a signal the command handles).

use std::io::IsTerminal;

use nix::sys::termios::{self, SetArg, Termios};

/// The size assumed when no descriptor is a terminal: the VT100's.
const DEFAULT_SIZE: (u16, u16) = (80, 24);

/// The terminal's size as (columns, rows), from stdin, stdout or stderr, whichever is a
/// terminal first.
pub(super) fn size() -> Option<(u16, u16)> {
    use terminal_size::{terminal_size_of, Height, Width};
    let of = |size: Option<(Width, Height)>| size.map(|(Width(w), Height(h))| (w, h));
    of(terminal_size_of(std::io::stdin()))
        .or_else(|| of(terminal_size_of(std::io::stdout())))
        .or_else(|| of(terminal_size_of(std::io::stderr())))
        .filter(|&(w, h)| w > 0 && h > 0)
}

/// [`size`], or 80x24.
pub(super) fn size_or_default() -> (u16, u16) {
    size().unwrap_or(DEFAULT_SIZE)
}

/// The local terminal in raw mode: every key (Ctrl-C, Ctrl-D, Ctrl-Z included) reaches the
/// remote side as bytes, and no local line editing or echo happens. Dropping it restores the
/// settings it found.
pub(super) struct RawMode {
    saved: Termios,
}

impl RawMode {
    /// Puts stdin's terminal in raw mode; `None` when stdin is not a terminal.
    pub(super) fn enter() -> anyhow::Result<Option<RawMode>> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Ok(None);
        }
        let saved = termios::tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(&stdin, SetArg::TCSANOW, &raw)?;
        Ok(Some(RawMode { saved }))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // TCSADRAIN: output still queued was written under raw settings; let it drain first.
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSADRAIN, &self.saved);
    }
}

/// Stdin's terminal with echo off (lines still edited and ended by Enter), for reading a
/// secret that must not show on the screen. Dropping it restores the settings it found.
pub(super) struct EchoOff {
    saved: Termios,
}

impl EchoOff {
    /// Turns echo off on stdin's terminal; `None` when stdin is not a terminal.
    pub(super) fn enter() -> anyhow::Result<Option<EchoOff>> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Ok(None);
        }
        let saved = termios::tcgetattr(&stdin)?;
        let mut quiet = saved.clone();
        quiet.local_flags.remove(termios::LocalFlags::ECHO);
        // TCSAFLUSH: nothing typed before the prompt becomes part of the secret.
        termios::tcsetattr(&stdin, SetArg::TCSAFLUSH, &quiet)?;
        Ok(Some(EchoOff { saved }))
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.saved);
    }
}
