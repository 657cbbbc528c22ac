//! How a client finds its relay from this machine: the address (`TETHER_RELAY`), the token
//! (`TETHER_TOKEN`, else the admin token a relay on this machine wrote), and where such a
//! relay keeps its files: the convention the relay writes by and the client reads by.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The file in the data directory that holds the local relay's admin token.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

/// How long a session may hear nothing at all (no frame, no pong) before it is taken for
/// dead, unless `TETHER_PEER_TIMEOUT` says otherwise: the relay's own default, so both ends
/// of a black-holed connection give up within the same bound.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);

/// The variable that sets the peer timeout.
const PEER_TIMEOUT_VAR: &str = "TETHER_PEER_TIMEOUT";

/// The data directory of a relay on this machine: `$TETHER_HOME`, else
/// `$XDG_DATA_HOME/tether`, else `~/.local/share/tether`.
pub fn data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TETHER_HOME") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME") {
        return PathBuf::from(dir).join("tether");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".local/share/tether")
}

/// The local relay's admin token file.
pub fn admin_token_path() -> PathBuf {
    data_dir().join(ADMIN_TOKEN_FILE)
}

/// Writes a token file as the relay (`admin.token`) and `tether mcp` leave theirs: mode 0600,
/// synced, and atomically, so a reader sees the old file or the whole new one, never a
/// partial token. The temporary file beside it is created 0600 and removed if anything fails.
pub fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    private_file(path, contents)?
        .persist(path)
        .map(drop)
        .map_err(|e| e.error)
}

/// Creates a private file as [`write_private`] writes one, but never replaces one: an existing
/// `path` is an `AlreadyExists` error and stays as it was. On a full disk, nothing is left
/// behind: no empty or partial file for the next start to read as damaged.
pub fn create_private(path: &Path, contents: &str) -> std::io::Result<()> {
    private_file(path, contents)?
        .persist_noclobber(path)
        .map(drop)
        .map_err(|e| e.error)
}

/// `contents` in a new, synced, mode 0600 temporary file beside `path`.
fn private_file(path: &Path, contents: &str) -> std::io::Result<tempfile::NamedTempFile> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut file = tempfile::Builder::new()
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)?;
    // Through the file itself: NamedTempFile's own writes name the temporary path in errors.
    file.as_file_mut().write_all(contents.as_bytes())?;
    file.as_file().sync_all()?;
    Ok(file)
}

/// The relay named by `flag`, else by `TETHER_RELAY`, else [`DEFAULT_RELAY`](crate::DEFAULT_RELAY).
pub fn relay_address(flag: Option<&str>) -> String {
    match flag {
        Some(url) => url.to_string(),
        None => std::env::var("TETHER_RELAY").unwrap_or_else(|_| crate::DEFAULT_RELAY.to_string()),
    }
}

/// `TETHER_TOKEN`, else the admin token of a relay on this machine, if it can be read.
pub fn token() -> Option<String> {
    std::env::var("TETHER_TOKEN").ok().or_else(|| {
        std::fs::read_to_string(admin_token_path())
            .ok()
            .map(|t| t.trim().to_string())
    })
}

/// `TETHER_PEER_TIMEOUT` (a duration such as `30s`), else [`DEFAULT_PEER_TIMEOUT`]; or why
/// the variable cannot be used.
pub fn peer_timeout() -> Result<Duration, String> {
    match std::env::var(PEER_TIMEOUT_VAR) {
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_PEER_TIMEOUT),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!(
            "{PEER_TIMEOUT_VAR} is not valid UTF-8: set it to a duration such as 30s"
        )),
        Ok(text) => parse_peer_timeout(&text),
    }
}

fn parse_peer_timeout(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text.trim()) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(format!(
            "{PEER_TIMEOUT_VAR}={text} is zero: set it to a duration such as 30s"
        )),
        Err(e) => Err(format!(
            "{PEER_TIMEOUT_VAR}={text} is not a duration ({e}): set it to one such as 30s"
        )),
    }
}

/// A relay address without its trailing slashes, or why it is not one.
pub fn check_relay_address(base: &str) -> Result<String, String> {
    let base = base.trim_end_matches('/');
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(format!(
            "the relay address `{base}` must start with http:// or https://"
        ));
    }
    // Checked here, so a malformed address (a port past 65535, a space) is named as such
    // instead of surfacing as an unreachable relay.
    match reqwest::Url::parse(base) {
        Ok(url) if url.host().is_some() => Ok(base.to_string()),
        Ok(_) => Err(format!("the relay address `{base}` names no host")),
        Err(e) => Err(format!(
            "the relay address `{base}` is not a valid URL ({e}); write it as \
             http://HOST:PORT, for example http://127.0.0.1:7420"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_addresses_are_checked_before_use() {
        assert_eq!(
            check_relay_address("http://127.0.0.1:7420/"),
            Ok("http://127.0.0.1:7420".into())
        );
        assert!(check_relay_address("https://relay.example/prefix").is_ok());
        let port = check_relay_address("http://127.0.0.1:70000").unwrap_err();
        assert!(port.contains("invalid port number"), "{port}");
        assert!(check_relay_address("127.0.0.1:7420")
            .unwrap_err()
            .contains("must start with http://"));
    }

    #[test]
    fn peer_timeouts_are_durations_longer_than_zero() {
        assert_eq!(parse_peer_timeout("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_peer_timeout(" 1m "), Ok(Duration::from_secs(60)));
        let zero = parse_peer_timeout("0s").unwrap_err();
        assert!(zero.contains("TETHER_PEER_TIMEOUT=0s is zero"), "{zero}");
        let junk = parse_peer_timeout("soon").unwrap_err();
        assert!(junk.contains("is not a duration"), "{junk}");
    }

    #[test]
    fn token_files_are_private_whole_and_never_written_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.token");
        write_private(&path, "first\n").unwrap();
        write_private(&path, "second\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "second\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        // A link planted where the token goes is replaced, not followed.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        write_private(&path, "third\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "third\n");

        // Nothing but the two files is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn a_created_private_file_never_replaces_one_or_follows_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.key");
        create_private(&path, "one\n").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = create_private(&path, "two\n").unwrap_err();
        assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\n");

        // A link planted where it goes (even a dangling one) is neither followed nor replaced.
        let link = dir.path().join("node.id");
        let target = dir.path().join("elsewhere");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let planted = create_private(&link, "three\n").unwrap_err();
        assert_eq!(planted.kind(), std::io::ErrorKind::AlreadyExists);
        assert!(!target.exists());

        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
