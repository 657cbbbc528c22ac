//! Where the cloud providers' credentials and endpoints come from: an environment variable
//! of the relay (`E2B_API_KEY`), else the same setting in `<data_dir>/config.toml`, whose
//! table is the variable's first word and whose key is the rest, in lower case:
//!
//! ```toml
//! [e2b]
//! api_key = "e2b_..."        # E2B_API_KEY
//! [daytona]
//! api_key = "dtn_..."        # DAYTONA_API_KEY
//! api_url = "https://app.daytona.io/api"
//! [modal]
//! token_id = "ak-..."        # MODAL_TOKEN_ID
//! token_secret = "as-..."    # MODAL_TOKEN_SECRET
//! ```
//!
//! Settings are read once, when the relay starts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tether_relay_core::provider::ProviderError;

/// The config file under the relay's data directory.
pub(crate) const CONFIG_FILE: &str = "config.toml";

/// A snapshot of the relay's environment and config file.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// Every setting, by variable name: the environment's win over the file's.
    values: BTreeMap<String, String>,
    /// The config file, for messages.
    file: PathBuf,
}

impl Settings {
    /// Reads `<data_dir>/config.toml` (absent is fine; unreadable is logged and ignored, so
    /// that `tether ls` keeps working) and the environment.
    pub fn load(data_dir: &Path) -> Settings {
        let file = data_dir.join(CONFIG_FILE);
        let mut values = BTreeMap::new();
        match std::fs::read_to_string(&file) {
            Ok(text) => match text.parse::<toml::Table>() {
                Ok(table) => flatten(&table, &mut values),
                Err(e) => tracing::warn!(
                    "ignoring {}: it is not valid TOML ({e}); fix it to use its provider settings",
                    file.display()
                ),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("ignoring {}: {e}", file.display()),
        }
        for (key, value) in std::env::vars() {
            let ours = ["E2B_", "DAYTONA_", "MODAL_", "RUNLOOP_"]
                .iter()
                .any(|p| key.starts_with(p));
            if ours && !value.is_empty() {
                values.insert(key, value);
            }
        }
        Settings { values, file }
    }

    /// Settings given directly (tests).
    #[cfg(test)]
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Settings {
        Settings {
            values: pairs
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            file: PathBuf::from(CONFIG_FILE),
        }
    }

    /// The setting `var` (e.g. `E2B_DOMAIN`), if set.
    pub fn get(&self, var: &str) -> Option<String> {
        self.values.get(var).cloned()
    }

    /// The credential `var`, or an error that says where to set it.
    pub fn require(&self, provider: &str, var: &str) -> Result<String, ProviderError> {
        self.get(var).ok_or_else(|| {
            let (table, key) = file_key(var);
            ProviderError::Auth(format!(
                "the {provider} provider needs credentials: set {var} in the relay's environment \
                 (or `{key}` under [{table}] in {}) and restart the relay",
                self.file.display()
            ))
        })
    }
}

/// `E2B_API_KEY` → (`e2b`, `api_key`).
fn file_key(var: &str) -> (String, String) {
    let lower = var.to_ascii_lowercase();
    match lower.split_once('_') {
        Some((table, key)) => (table.to_string(), key.to_string()),
        None => (lower.clone(), lower),
    }
}

/// `[e2b] api_key = "x"` → `E2B_API_KEY = x`; values that are not strings are skipped.
fn flatten(table: &toml::Table, out: &mut BTreeMap<String, String>) {
    for (section, inner) in table {
        let Some(inner) = inner.as_table() else {
            continue;
        };
        for (key, value) in inner {
            let value = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                _ => continue,
            };
            let var = format!("{section}_{key}").to_ascii_uppercase();
            out.insert(var, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_read_under_the_variable_names() {
        let dir = tempfile::tempdir().unwrap();
        let file =
            "[tetherzz]\nsome_key = \"from the file\"\nport = 7\n[ignored]\nnested = { a = 1 }\n";
        std::fs::write(dir.path().join(CONFIG_FILE), file).unwrap();
        let settings = Settings::load(dir.path());
        assert_eq!(
            settings.get("TETHERZZ_SOME_KEY").as_deref(),
            Some("from the file")
        );
        assert_eq!(settings.get("TETHERZZ_PORT").as_deref(), Some("7"));
        assert!(settings.get("IGNORED_NESTED").is_none());
    }

    #[test]
    fn a_missing_credential_names_the_variable_and_the_file_key() {
        let err = Settings::from_pairs([])
            .require("modal", "MODAL_TOKEN_ID")
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ProviderError::Auth(_)));
        assert!(msg.contains("MODAL_TOKEN_ID"), "{msg}");
        assert!(msg.contains("`token_id` under [modal]"), "{msg}");
    }
}
