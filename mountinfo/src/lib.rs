//! Reading `/proc/self/mountinfo` (proc(5)): the local runtime finds the cgroup hierarchies
//! and what is still mounted under a sandbox's directory in it, and the agent finds where its
//! sandbox can write.
#![warn(missing_docs)]

use std::path::{Path, PathBuf};

/// One line of `/proc/<pid>/mountinfo` (see proc(5)), with the fields we use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted, unescaped.
    pub mount_point: PathBuf,
    /// The per-mount options, e.g. `ro,nosuid,relatime`.
    pub mount_options: String,
    /// The file-system type, e.g. `cgroup2`.
    pub fs_type: String,
    /// The per-superblock options, e.g. `rw,memory` for a v1 memory hierarchy.
    pub super_options: String,
}

/// The current process's mounts; an unreadable table reads as empty.
pub fn current() -> Vec<Mount> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| parse(&text))
        .unwrap_or_default()
}

/// Parses a mountinfo table, skipping malformed lines.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mount> {
    let fields: Vec<&str> = line.split(' ').collect();
    let mount_point = *fields.get(4)?;
    let mount_options = *fields.get(5)?;
    // Optional fields run from index 6 to a lone "-"; type, source and options follow it.
    let dash = fields.iter().skip(6).position(|f| *f == "-")? + 6;
    Some(Mount {
        mount_point: PathBuf::from(unescape(mount_point)),
        mount_options: mount_options.to_string(),
        fs_type: fields.get(dash + 1)?.to_string(),
        super_options: fields.get(dash + 3)?.to_string(),
    })
}

/// Undoes the kernel's octal escapes (`\040` for a space, `\134` for a backslash).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Mount {
    /// Whether files can be written through this mount (its per-mount options say `rw`).
    pub fn writable(&self) -> bool {
        self.mount_options.split(',').any(|o| o == "rw")
    }
}

/// Mount points at or below `dir`, deepest first (the order to unmount them in).
pub fn under(mounts: &[Mount], dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mounts
        .iter()
        .filter(|m| m.mount_point.starts_with(dir))
        .map(|m| m.mount_point.clone())
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_after_optional_ones() {
        let text = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup \
                    rw,memory\n\
                    41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
                    garbage\n";
        let mounts = parse(text);
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].mount_point, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(mounts[0].fs_type, "cgroup");
        assert_eq!(mounts[0].mount_options, "rw,relatime");
        assert!(mounts[0].writable());
        assert_eq!(mounts[0].super_options, "rw,memory");
        assert_eq!(mounts[1].fs_type, "cgroup2");
    }

    #[test]
    fn unescapes_spaces_and_backslashes() {
        assert_eq!(unescape(r"/data/my\040dir\134x"), r"/data/my dir\x");
        assert_eq!(unescape(r"/trailing\04"), r"/trailing\04");
    }

    #[test]
    fn lists_mounts_under_a_dir_deepest_first() {
        let text = "1 0 0:1 / /d/sb rw - tmpfs t rw\n\
                    2 1 0:2 / /d/sb/root/proc rw - proc p rw\n\
                    3 0 0:3 / /d/sb-other rw - tmpfs t rw\n";
        let found = under(&parse(text), Path::new("/d/sb"));
        assert_eq!(
            found,
            vec![PathBuf::from("/d/sb/root/proc"), PathBuf::from("/d/sb")]
        );
    }
}
