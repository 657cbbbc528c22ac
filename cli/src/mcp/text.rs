//! Turning bytes from a sandbox into text for an MCP answer: cut on character boundaries,
//! long outputs folded to their head and tail, line ranges of a file.

/// The length of the longest prefix of `bytes`, at most `max` long, that does not end in
/// the middle of a UTF-8 sequence. Invalid bytes are not a sequence and are kept; a prefix
/// never becomes empty because of this unless `max` is 0.
pub(super) fn utf8_cut(bytes: &[u8], max: usize) -> usize {
    if bytes.len() <= max {
        return bytes.len();
    }
    boundary(bytes, max)
}

/// `at`, moved back to the start of the UTF-8 sequence that `bytes[..at]` ends inside of,
/// if it ends inside one: the length of the longest prefix of `bytes[..at]` that holds only
/// whole characters (and invalid bytes, which stay).
pub(super) fn boundary(bytes: &[u8], at: usize) -> usize {
    let max = at.min(bytes.len());
    // A sequence is at most 4 bytes: look back over at most 3 continuation bytes for the
    // lead byte of the sequence the cut falls into.
    for back in 1..=3.min(max) {
        let b = bytes[max - back];
        if b & 0xC0 == 0x80 {
            continue;
        }
        let len = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if len > back { max - back } else { max };
    }
    max
}

/// The start of the longest suffix of `bytes`, at most `max` long, that begins on a
/// character boundary.
fn utf8_tail_start(bytes: &[u8], max: usize) -> usize {
    let mut start = bytes.len().saturating_sub(max);
    let limit = (start + 3).min(bytes.len());
    while start < limit && bytes[start] & 0xC0 == 0x80 {
        start += 1;
    }
    start
}

/// `output` as text for an answer: whole when it fits in `inline` bytes, else its head and
/// tail around a marker naming `note` (where the rest is). Returns the text and whether
/// bytes were left out.
pub(super) fn fold(output: &[u8], inline: usize, note: &str) -> (String, bool) {
    if output.len() <= inline {
        return (String::from_utf8_lossy(output).into_owned(), false);
    }
    let head = utf8_cut(output, inline / 2);
    let tail = utf8_tail_start(output, inline / 2).max(head);
    let omitted = tail - head;
    let text = format!(
        "{}\n[... {omitted} bytes omitted; {note} ...]\n{}",
        String::from_utf8_lossy(&output[..head]),
        String::from_utf8_lossy(&output[tail..]),
    );
    (text, true)
}

/// Lines `first..first + count` (1-based) of `text`, each cut to `max_chars`, stopping
/// before the line that would take the result past `budget` bytes (the first line is always
/// returned). Returns the lines joined with their newlines, the last line number returned,
/// the total number of lines, and whether any line was cut.
pub(super) fn line_range(
    text: &str,
    first: usize,
    count: usize,
    max_chars: usize,
    budget: usize,
) -> LineRange {
    let total = text.lines().count();
    let mut out = String::new();
    let mut last = first.saturating_sub(1);
    let mut cut = false;
    for line in text.lines().skip(first.saturating_sub(1)).take(count) {
        let shown = cut_line(line, max_chars);
        if !out.is_empty() && out.len() + shown.len() + 1 > budget {
            break;
        }
        cut |= shown.len() != line.len();
        out.push_str(&shown);
        out.push('\n');
        last += 1;
    }
    LineRange {
        text: out,
        last,
        total,
        cut,
    }
}

/// What [`line_range`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct LineRange {
    /// The lines, each with a newline.
    pub text: String,
    /// The number of the last line returned (first - 1 when none was).
    pub last: usize,
    /// Lines in the whole text.
    pub total: usize,
    /// A line longer than the limit was cut.
    pub cut: bool,
}

/// `line` cut to `max_chars` characters.
pub(super) fn cut_line(line: &str, max_chars: usize) -> String {
    match line.char_indices().nth(max_chars) {
        Some((at, _)) => format!("{} [line cut]", &line[..at]),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_fall_between_characters() {
        let s = "aé€😀".as_bytes(); // 1 + 2 + 3 + 4 bytes
        assert_eq!(utf8_cut(s, 10), 10);
        assert_eq!(utf8_cut(s, 9), 6);
        assert_eq!(utf8_cut(s, 7), 6);
        assert_eq!(utf8_cut(s, 6), 6);
        assert_eq!(utf8_cut(s, 5), 3);
        assert_eq!(utf8_cut(s, 2), 1);
        assert_eq!(utf8_cut(s, 0), 0);
        // Invalid bytes are kept as they are.
        assert_eq!(utf8_cut(&[0xff, 0xff, 0xff], 2), 2);
        // A character still being written is held back.
        assert_eq!(boundary(&"a€".as_bytes()[..3], 3), 1);
        assert_eq!(boundary("a€".as_bytes(), 4), 4);
    }

    #[test]
    fn long_output_keeps_head_and_tail() {
        let out: Vec<u8> = (0..1000)
            .flat_map(|i| format!("{i:04}\n").into_bytes())
            .collect();
        let (text, cut) = fold(&out, 100, "see /tmp/x");
        assert!(cut);
        assert!(text.starts_with("0000\n"));
        assert!(text.ends_with("0999\n"));
        assert!(text.contains("[... 4900 bytes omitted; see /tmp/x ...]"));
        assert_eq!(fold(b"short", 100, ""), ("short".to_string(), false));
        let (text, _) = fold("€".repeat(100).as_bytes(), 10, "n");
        assert!(!text.contains('\u{fffd}'));
    }

    #[test]
    fn line_ranges() {
        let text = "one\ntwo\nthree\nfour";
        let r = line_range(text, 2, 2, 100, 1000);
        assert_eq!(
            (r.text.as_str(), r.last, r.total, r.cut),
            ("two\nthree\n", 3, 4, false)
        );
        let r = line_range(text, 4, 10, 100, 1000);
        assert_eq!((r.text.as_str(), r.last), ("four\n", 4));
        let r = line_range(text, 9, 10, 100, 1000);
        assert_eq!((r.text.as_str(), r.last), ("", 8));
        let r = line_range("abcdef", 1, 1, 3, 1000);
        assert_eq!((r.text.as_str(), r.cut), ("abc [line cut]\n", true));
        // The budget stops before a line that would not fit, never before the first.
        let r = line_range(text, 1, 10, 100, 9);
        assert_eq!((r.text.as_str(), r.last), ("one\ntwo\n", 2));
        let r = line_range(text, 3, 10, 100, 1);
        assert_eq!((r.text.as_str(), r.last), ("three\n", 3));
    }
}
