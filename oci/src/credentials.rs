//! Registry credentials from the docker config file (`$DOCKER_CONFIG/config.json`, else
//! `~/.docker/config.json`), as `docker login` and `podman login --authfile` write it: an
//! `auths` map from registry to base64 `user:password`. Credential helpers (`credsStore`,
//! `credHelpers`) are not run; a registry that only has one is reported.

use std::collections::BTreeMap;
use std::path::PathBuf;

use base64::Engine;
use serde::Deserialize;

use super::error::ImageError;
use super::layout::read_json_file;

/// The names of Docker Hub (whose key in the file is `https://index.docker.io/v1/`).
const DOCKER_HUB_NAMES: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];

/// A user name and password (or token) for basic auth and token requests.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Credentials {
    /// The user.
    pub username: String,
    /// The password or access token.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigFile {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default)]
    creds_store: Option<String>,
    #[serde(default)]
    cred_helpers: BTreeMap<String, String>,
}

#[derive(Default, Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// The docker config file in use.
pub(crate) fn config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".docker/config.json"))
}

/// The credentials for `registry` (`host[:port]`), if the config file has some.
pub(crate) fn lookup(registry: &str) -> Result<Option<Credentials>, ImageError> {
    let Some(path) = config_path().filter(|p| p.exists()) else {
        return Ok(None);
    };
    let file: ConfigFile = read_json_file(&path).map_err(|reason| ImageError::Auth {
        registry: registry.to_string(),
        reason: format!("the docker config file cannot be used: {reason}"),
    })?;
    find(&file, registry).map_err(|reason| ImageError::Auth {
        registry: registry.to_string(),
        reason: format!("{reason} (in {})", path.display()),
    })
}

fn find(file: &ConfigFile, registry: &str) -> Result<Option<Credentials>, String> {
    let wanted = canonical(registry);
    let entry = file
        .auths
        .iter()
        .find(|(key, _)| canonical(key) == wanted)
        .map(|(_, e)| e);
    if let Some(entry) = entry {
        if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
            return decode(auth).map(Some);
        }
        if let (Some(username), Some(password)) = (&entry.username, &entry.password) {
            return Ok(Some(Credentials {
                username: username.clone(),
                password: password.clone(),
            }));
        }
    }
    let helper = file
        .cred_helpers
        .iter()
        .find(|(k, _)| canonical(k) == wanted)
        .map(|(_, h)| h);
    if let Some(helper) = helper.or(file.creds_store.as_ref()) {
        tracing::warn!(
            "the credentials for {registry} are kept by docker-credential-{helper}, which tether \
             does not run; pushing without credentials"
        );
    }
    Ok(None)
}

/// `https://host:port/v1/` → `host:port`; Docker Hub's names → one.
fn canonical(key: &str) -> String {
    let key = key
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = key.split('/').next().unwrap_or(key).to_ascii_lowercase();
    if DOCKER_HUB_NAMES.contains(&host.as_str()) {
        DOCKER_HUB_NAMES[0].to_string()
    } else {
        host
    }
}

/// base64 `user:password`.
fn decode(auth: &str) -> Result<Credentials, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .map_err(|_| "its `auth` entry is not base64".to_string())?;
    let text = String::from_utf8(bytes).map_err(|_| "its `auth` entry is not text".to_string())?;
    let (username, password) = text
        .split_once(':')
        .ok_or_else(|| "its `auth` entry is not `user:password`".to_string())?;
    Ok(Credentials {
        username: username.to_string(),
        password: password.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str) -> ConfigFile {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn entries_match_by_host_whatever_their_form() {
        let f = file(
            r#"{"auths":{
            "https://index.docker.io/v1/":{"auth":"aHViOnNlY3JldA=="},
            "localhost:5000":{"auth":"dXNlcjpwYTpzcw=="},
            "http://ghcr.io/v2/":{"username":"u","password":"p"}}}"#,
        );
        let hub = find(&f, "docker.io").unwrap().unwrap();
        assert_eq!(
            (hub.username.as_str(), hub.password.as_str()),
            ("hub", "secret")
        );
        let local = find(&f, "localhost:5000").unwrap().unwrap();
        assert_eq!(
            (local.username.as_str(), local.password.as_str()),
            ("user", "pa:ss")
        );
        assert_eq!(find(&f, "ghcr.io").unwrap().unwrap().username, "u");
        assert!(find(&f, "quay.io").unwrap().is_none());
        assert!(format!("{hub:?}").contains("hub") && !format!("{hub:?}").contains("secret"));
    }

    #[test]
    fn a_broken_entry_is_an_error_and_helpers_are_not_run() {
        let f = file(r#"{"auths":{"r.io":{"auth":"%%%"}}}"#);
        assert!(find(&f, "r.io").unwrap_err().contains("base64"));
        let f = file(r#"{"auths":{},"credsStore":"desktop"}"#);
        assert!(find(&f, "r.io").unwrap().is_none());
    }
}
