//! How a client finds its relay from this machine: the address (`TETHER_RELAY`), the token
//! (`TETHER_TOKEN`, else the admin token a relay on this machine wrote), and where such a
//! relay keeps its files: the convention the relay writes by and the client reads by.

use std::path::PathBuf;

/// The file in the data directory that holds the local relay's admin token.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

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

/// A relay address without its trailing slashes, or why it is not one.
pub fn check_relay_address(base: &str) -> Result<String, String> {
    let base = base.trim_end_matches('/');
    if base.starts_with("http://") || base.starts_with("https://") {
        Ok(base.to_string())
    } else {
        Err(format!(
            "the relay address `{base}` must start with http:// or https://"
        ))
    }
}
