//! What a sync tells its user: one line per batch ("synced 3 files, 1 deleted, 12.00 KiB in
//! 41 ms"), conflicts and problems as they happen, connection changes, and a progress bar
//! for large transfers on a terminal. `--json` prints the same events as JSON lines on
//! stdout, for scripts and tests.

use std::io::{IsTerminal, Write};
use std::time::Duration;
use tether_client::escape::escape_lines;

use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use super::constants::PROGRESS_MIN_BYTES;
use super::tree::shown;

/// What one batch (or the initial sync) did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Local entries compared.
    pub checked: u64,
    /// Files and symlinks sent.
    pub files: u64,
    /// Directories created or changed.
    pub dirs: u64,
    /// Remote paths deleted (a whole directory counts once).
    pub deleted: u64,
    /// Remote paths kept as conflict copies.
    pub conflicts: u64,
    /// Bytes of file content sent.
    pub bytes: u64,
    /// Bytes on the wire (after compression).
    pub wire_bytes: u64,
    /// Remote renames carried out instead of a delete and a re-send.
    pub renamed: u64,
    /// How long it took, in milliseconds.
    pub ms: u64,
}

impl Stats {
    /// Whether anything moved.
    pub(crate) fn changed(&self) -> bool {
        self.files + self.dirs + self.deleted + self.conflicts + self.renamed > 0
    }
}

/// Why a batch ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The first sync of a run.
    Initial,
    /// Local changes while watching.
    Change,
    /// A full rescan (after a reconnection, an overflow, or a `.gitignore` change).
    Rescan,
    /// A pull from the sandbox.
    Pull,
}

/// How to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Sentences on stdout, problems on stderr, a progress bar on a terminal.
    Human,
    /// JSON lines on stdout.
    Json,
    /// Nothing (a shell owns the terminal).
    Quiet,
}

/// Prints a sync's events.
#[derive(Clone, Debug)]
pub struct Reporter {
    format: Format,
}

#[derive(Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum Line<'a> {
    Synced {
        phase: Phase,
        #[serde(flatten)]
        stats: &'a Stats,
    },
    Conflict {
        path: &'a str,
        kept_as: &'a str,
    },
    Problem {
        message: &'a str,
    },
    Watching {
        local: &'a str,
        remote: &'a str,
    },
    Disconnected {
        error: &'a str,
        retry_ms: u64,
    },
    Reconnected,
}

impl Reporter {
    /// A reporter printing in `format`.
    pub fn new(format: Format) -> Reporter {
        Reporter { format }
    }

    /// A batch is done. Batches that changed nothing are not reported while watching.
    pub(crate) fn synced(&self, phase: Phase, stats: &Stats) {
        if !stats.changed() && phase == Phase::Change {
            return;
        }
        self.emit(&Line::Synced { phase, stats }, || {
            let lead = match phase {
                Phase::Initial => "initial sync: ",
                Phase::Rescan => "rescan: ",
                Phase::Pull => "pulled: ",
                Phase::Change => "",
            };
            if !stats.changed() {
                return format!(
                    "{lead}up to date ({} paths checked in {} ms)",
                    stats.checked, stats.ms
                );
            }
            let mut parts = vec![format!(
                "{} {}",
                stats.files,
                plural(stats.files, "file", "files")
            )];
            if stats.dirs > 0 {
                parts.push(format!(
                    "{} {}",
                    stats.dirs,
                    plural(stats.dirs, "directory", "directories")
                ));
            }
            if stats.renamed > 0 {
                parts.push(format!("{} renamed", stats.renamed));
            }
            if stats.deleted > 0 {
                parts.push(format!("{} deleted", stats.deleted));
            }
            if stats.conflicts > 0 {
                parts.push(format!("{} kept as conflict copies", stats.conflicts));
            }
            let verb = if phase == Phase::Pull { "" } else { "synced " };
            format!(
                "{lead}{verb}{}, {} in {} ms",
                parts.join(", "),
                HumanBytes(stats.bytes),
                stats.ms
            )
        });
    }

    /// A changed file was kept as a conflict copy.
    pub(crate) fn conflict(&self, path: &str, kept_as: &str) {
        // Keys hold names that are not UTF-8 in their own form; people see them escaped.
        let (path, kept_as) = (&*shown(path), &*shown(kept_as));
        self.emit(&Line::Conflict { path, kept_as }, || {
            format!("conflict: {path} changed on both sides; the other side's copy is kept as {kept_as}")
        });
    }

    /// Something was skipped; the sync goes on.
    pub(crate) fn problem(&self, message: &str) {
        match self.format {
            Format::Human => eprintln!("tether sync: {}", escape_lines(message)),
            _ => self.emit(&Line::Problem { message }, String::new),
        }
    }

    /// The initial sync is done and changes are being watched.
    pub(crate) fn watching(&self, local: &str, remote: &str) {
        self.emit(&Line::Watching { local, remote }, || {
            format!("watching {local} -> {remote} (Ctrl-C to stop)")
        });
    }

    /// The connection dropped; the next attempt is in `retry`.
    pub(crate) fn disconnected(&self, error: &str, retry: Duration) {
        let retry_ms = retry.as_millis() as u64;
        self.emit(&Line::Disconnected { error, retry_ms }, || {
            format!("connection lost ({error}); reconnecting in {retry_ms} ms")
        });
    }

    /// The connection is back; a rescan follows.
    pub(crate) fn reconnected(&self) {
        self.emit(&Line::Reconnected, || "reconnected; rescanning".into());
    }

    /// A progress bar for `bytes` of uploads, shown only for a person, on a terminal, and
    /// for transfers large enough to be worth one.
    pub(crate) fn progress(&self, bytes: u64) -> ProgressBar {
        if self.format != Format::Human
            || bytes < PROGRESS_MIN_BYTES
            || !std::io::stderr().is_terminal()
        {
            return ProgressBar::hidden();
        }
        let bar =
            ProgressBar::with_draw_target(Some(bytes), ProgressDrawTarget::stderr_with_hz(10));
        if let Ok(style) = ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
        ) {
            bar.set_style(style);
        }
        bar
    }

    fn emit(&self, line: &Line<'_>, human: impl FnOnce() -> String) {
        let mut out = std::io::stdout().lock();
        let _ = match self.format {
            Format::Quiet => return,
            Format::Json => serde_json::to_string(line).map(|s| writeln!(out, "{s}")),
            // Paths and messages come from the sandbox: escaped, never raw on a terminal.
            Format::Human => Ok(writeln!(out, "{}", escape_lines(&human()))),
        };
        let _ = out.flush();
    }
}

fn plural(n: u64, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 {
        one
    } else {
        many
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_flatten_the_stats() {
        let stats = Stats {
            files: 3,
            deleted: 1,
            bytes: 12,
            ms: 41,
            ..Stats::default()
        };
        let line = serde_json::to_value(Line::Synced {
            phase: Phase::Change,
            stats: &stats,
        })
        .unwrap();
        assert_eq!(line["event"], "synced");
        assert_eq!(line["phase"], "change");
        assert_eq!(line["files"], 3);
        assert_eq!(line["bytes"], 12);
    }
}
