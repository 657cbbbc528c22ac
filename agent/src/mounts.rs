//! Where the sandbox can write, read from its mount table: what a write refused by a
//! read-only file system names, so the caller (often a model) knows where to go instead.

/// The mounts of `/proc/self/mountinfo` that are writable and hold files (not `/proc`,
/// `/sys` or `/dev`), by mount point, at most [`MAX_SHOWN`].
pub(crate) fn writable_places() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|table| writable_in(&table))
        .unwrap_or_default()
}

/// How many places a message names.
const MAX_SHOWN: usize = 8;

/// Mount points the kernel's and the devices' file systems live under: never a place to
/// put files.
const SYSTEM: [&str; 3] = ["/proc", "/sys", "/dev"];

fn writable_in(table: &str) -> Vec<String> {
    let mut places: Vec<String> = tether_mountinfo::parse(table)
        .into_iter()
        .filter(|m| m.writable())
        .filter(|m| !SYSTEM.iter().any(|s| m.mount_point.starts_with(s)))
        .map(|m| m.mount_point.to_string_lossy().into_owned())
        .collect();
    places.sort();
    places.dedup();
    places.truncate(MAX_SHOWN);
    places
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_writable_places_that_hold_files_are_named() {
        let table = "\
22 1 8:1 / / ro,relatime - overlay overlay ro
23 22 0:5 / /proc rw,nosuid - proc proc rw
24 22 0:6 / /dev rw - tmpfs tmpfs rw
25 24 0:7 / /dev/shm rw - tmpfs tmpfs rw
26 22 7:0 /workspace /workspace rw,nosuid,nodev - ext4 /dev/loop0 rw
27 22 7:0 /tmp /tmp rw,nosuid,nodev - ext4 /dev/loop0 rw
28 22 8:1 /usr /usr ro,nosuid - ext4 /dev/sda1 rw
29 22 0:8 / /my\\040data rw - tmpfs tmpfs rw
30 22 0:9 / /sysroot rw - tmpfs tmpfs rw
";
        assert_eq!(
            writable_in(table),
            ["/my data", "/sysroot", "/tmp", "/workspace"]
        );
        assert!(writable_in("garbage\n\n1 2 3\n").is_empty());
    }
}
