//! Text a sandbox chose (file names, labels, agent facts, error messages), made safe to print
//! on a terminal: [`escape`] is the one function every printer of such text goes through.
//!
//! A name is hostile input: `\x1b]0;...\x07` retitles the window, `\x1b[2J` clears it, a
//! carriage return overwrites the line before it, a right-to-left override reorders what
//! follows. Escaped, each shows as the characters of its escape instead of acting.

use std::borrow::Cow;
use std::ffi::OsStr;
use std::fmt::Write;
use std::os::unix::ffi::OsStrExt;

/// `bytes` as printable text: control characters (C0, DEL and C1), Unicode's bidirectional
/// and zero-width formatting characters, and bytes that are not UTF-8 are shown as `\n`,
/// `\t`, `\r`, `\xNN` or `\u{NNNN}`; everything else is kept as it is.
///
/// A backslash is kept as it is, on purpose: the result never contains a character this
/// function would change, so escaping twice (a name escaped into an error message, the
/// message escaped again when printed) gives the same text. What matters is that no raw
/// control character reaches a terminal, not that the escape can be reversed.
pub fn escape(bytes: &[u8]) -> Cow<'_, str> {
    if let Ok(text) = std::str::from_utf8(bytes) {
        if !text.chars().any(needs_escape) {
            return Cow::Borrowed(text);
        }
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            push_char(&mut out, c);
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    Cow::Owned(out)
}

/// [`escape`] for a `str`.
pub fn escape_str(text: &str) -> Cow<'_, str> {
    escape(text.as_bytes())
}

/// [`escape`] for a path or any OS string.
pub fn escape_os(text: &OsStr) -> Cow<'_, str> {
    escape(text.as_bytes())
}

/// [`escape`] line by line, keeping the line breaks: for multi-line messages (an error and
/// its causes) whose lines may each carry sandbox text.
pub fn escape_lines(text: &str) -> String {
    text.split('\n')
        .map(escape_str)
        .collect::<Vec<_>>()
        .join("\n")
}

fn push_char(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        c if (c as u32) < 0x100 && needs_escape(c) => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c if needs_escape(c) => {
            let _ = write!(out, "\\u{{{:04x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// Control characters, and the invisible formatting characters that reorder or hide text.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_sequences_are_shown_not_run() {
        assert_eq!(escape(b"plain name.txt"), "plain name.txt");
        assert!(matches!(escape(b"ok"), Cow::Borrowed(_)));
        assert_eq!(escape(b"\x1b]0;pwned\x07x"), "\\x1b]0;pwned\\x07x");
        assert_eq!(escape(b"a\nb\tc\rd\x7f"), "a\\nb\\tc\\rd\\x7f");
        assert_eq!(escape("\u{9b}31m".as_bytes()), "\\x9b31m");
        assert_eq!(
            escape("abc\u{202e}txt.exe".as_bytes()),
            "abc\\u{202e}txt.exe"
        );
        assert_eq!(escape(b"caf\xe9 \xff"), "caf\\xe9 \\xff");
        assert_eq!(escape("日本語 ✓".as_bytes()), "日本語 ✓");
    }

    #[test]
    fn escaping_twice_changes_nothing_more() {
        for raw in [&b"\x1b[2J"[..], b"a\\x1b", b"\xff\n\x00"] {
            let once = escape(raw).into_owned();
            assert_eq!(escape(once.as_bytes()), once);
        }
        assert_eq!(escape_lines("one \x1b[31m\ntwo"), "one \\x1b[31m\ntwo");
    }
}
