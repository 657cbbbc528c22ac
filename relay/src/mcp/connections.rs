//! One protocol session per sandbox, opened on first use and shared by every tool call and
//! exec session of this server; a session found closed is replaced by a fresh one.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::client::{RelayClient, Session};

use super::error::{invalid, ToolError};

/// The longest sandbox id accepted.
const MAX_ID_LEN: usize = 128;

/// The relay and the open sessions to its sandboxes.
#[derive(Debug)]
pub struct Connections {
    relay: RelayClient,
    open: Mutex<HashMap<String, Session>>,
}

impl Connections {
    /// No sessions yet.
    pub fn new(relay: RelayClient) -> Connections {
        Connections {
            relay,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// The relay's REST client.
    pub fn relay(&self) -> &RelayClient {
        &self.relay
    }

    /// A live session to `id`, reusing the open one.
    pub async fn get(&self, id: &str) -> Result<Session, ToolError> {
        check_id(id)?;
        if let Some(s) = self.lock().get(id).filter(|s| !s.is_closed()) {
            return Ok(s.clone());
        }
        self.fresh(id).await
    }

    /// A new session to `id`, replacing any cached one.
    pub async fn fresh(&self, id: &str) -> Result<Session, ToolError> {
        check_id(id)?;
        let session = self.relay.connect(id).await?;
        self.lock().insert(id.to_string(), session.clone());
        Ok(session)
    }

    /// Forgets the session to a deleted sandbox.
    pub fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Refuses ids that could not be a relay's sandbox id before they reach a URL.
pub fn check_id(id: &str) -> Result<(), ToolError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !id.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "`{}` is not a sandbox id: ids look like sb-3f9a2c (see sandbox_list)",
            crate::escape::escape_str(id)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_ids_cannot_reach_other_routes() {
        assert!(check_id("sb-3f9a2c").is_ok());
        assert!(check_id("sb_1.x").is_ok());
        for bad in [
            "",
            "..",
            "../tokens",
            "a/b",
            "a?b",
            "a b",
            "a%2f",
            &"x".repeat(200),
        ] {
            assert!(check_id(bad).is_err(), "{bad}");
        }
    }
}
