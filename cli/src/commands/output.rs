//! What commands print: aligned tables for people, `--json` for programs, and the small
//! formats both use (ages, sizes, labels).

use std::collections::BTreeMap;
use std::io::Write;

use serde::Serialize;

use tether_client::escape::escape_str;

/// Spaces between table columns.
const COLUMN_GAP: usize = 3;

/// Prints `value` as pretty JSON and a newline on stdout.
pub(super) fn json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// Prints `value` as JSON on one line (a stream of values, one per line).
pub(super) fn json_line<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// A table printed with each column as wide as its widest cell.
pub(super) struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these column titles.
    pub(super) fn new(headers: &[&'static str]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; it must have one cell per column. Cells are printed escaped (whatever
    /// a sandbox or tenant chose stays text); escaping twice changes nothing.
    pub(super) fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows
            .push(cells.iter().map(|c| escape_str(c).into_owned()).collect());
    }

    /// The table as text, one line per row, no trailing spaces.
    pub(super) fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let headers: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        let mut text = String::new();
        for row in std::iter::once(&headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                line.push_str(cell);
                if i + 1 < row.len() {
                    let pad = widths[i] - cell.chars().count() + COLUMN_GAP;
                    line.push_str(&" ".repeat(pad));
                }
            }
            text.push_str(line.trim_end());
            text.push('\n');
        }
        text
    }

    /// Prints the table on stdout.
    pub(super) fn print(&self) -> anyhow::Result<()> {
        std::io::stdout()
            .lock()
            .write_all(self.render().as_bytes())?;
        Ok(())
    }
}

/// How long ago `ms` (milliseconds since the Unix epoch) was, in its largest unit: `42s`,
/// `5m`, `3h`, `2d`.
pub(super) fn age(ms: i64, now_ms: i64) -> String {
    let secs = (now_ms - ms).max(0) / 1000;
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// Now, in milliseconds since the Unix epoch.
pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `k=v,k2=v2`, or `-` when there are none; escaped (labels are any tenant's text).
pub(super) fn labels(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "-".into();
    }
    let pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{}={}", escape_str(k), escape_str(v)))
        .collect();
    pairs.join(",")
}

/// A byte count in binary units: `512 B`, `1.5 GiB`.
pub(super) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_without_trailing_spaces() {
        let mut t = Table::new(&["ID", "STATE"]);
        t.row(vec!["sb-1234".into(), "running".into()]);
        t.row(vec!["sb-1".into(), "".into()]);
        assert_eq!(t.render(), "ID        STATE\nsb-1234   running\nsb-1\n");
    }

    #[test]
    fn ages_use_the_largest_unit() {
        assert_eq!(age(0, 42_000), "42s");
        assert_eq!(age(0, 300_000), "5m");
        assert_eq!(age(0, 3 * 3_600_000 + 5), "3h");
        assert_eq!(age(0, 2 * 86_400_000), "2d");
        assert_eq!(age(10, 0), "0s");
    }

    #[test]
    fn sizes_and_labels() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
        assert_eq!(labels(&BTreeMap::new()), "-");
        let l = BTreeMap::from([("a".to_string(), "1".to_string()), ("b".into(), "2".into())]);
        assert_eq!(super::labels(&l), "a=1,b=2");
        let hostile = BTreeMap::from([("k\x1b]0;x\x07".to_string(), "\x1b[2J".to_string())]);
        assert_eq!(super::labels(&hostile), "k\\x1b]0;x\\x07=\\x1b[2J");
    }
}
