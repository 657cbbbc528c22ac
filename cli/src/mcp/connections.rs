//! One protocol session per sandbox, opened on first use and shared by every tool call and
//! exec session of this server; a session found closed is replaced by a fresh one.
//!
//! An open connection counts as client activity: the relay never idles out a sandbox with
//! one. So a connection no tool call used for [`CONNECTION_IDLE`] is let go (an exec session
//! still running keeps its own), and the sandbox's idle timeout works as for any client.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::time::Instant;

use tether_client::{RelayClient, Session};

use super::constants::{CONNECTION_IDLE, CONNECTION_SWEEP};
use super::error::{invalid, ToolError};

/// The longest sandbox id accepted.
const MAX_ID_LEN: usize = 128;

/// The relay and the open sessions to its sandboxes.
#[derive(Debug)]
pub(super) struct Connections {
    relay: RelayClient,
    open: Mutex<HashMap<String, (Session, Instant)>>,
}

impl Connections {
    /// No sessions yet.
    pub(super) fn new(relay: RelayClient) -> Connections {
        Connections {
            relay,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// The relay's REST client.
    pub(super) fn relay(&self) -> &RelayClient {
        &self.relay
    }

    /// A live session to `id`, reusing the open one.
    pub(super) async fn get(&self, id: &str) -> Result<Session, ToolError> {
        check_id(id)?;
        if let Some((s, used)) = self.lock().get_mut(id).filter(|(s, _)| !s.is_closed()) {
            *used = Instant::now();
            return Ok(s.clone());
        }
        self.fresh(id).await
    }

    /// A new session to `id`, replacing any cached one.
    pub(super) async fn fresh(&self, id: &str) -> Result<Session, ToolError> {
        check_id(id)?;
        let session = self.relay.connect(id).await?;
        self.lock()
            .insert(id.to_string(), (session.clone(), Instant::now()));
        Ok(session)
    }

    /// Lets go, every [`CONNECTION_SWEEP`], of the connections unused for
    /// [`CONNECTION_IDLE`]; ends when the connections are dropped.
    pub(super) fn sweep_idle(self: &Arc<Self>) {
        let weak: Weak<Connections> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(CONNECTION_SWEEP);
            loop {
                tick.tick().await;
                let Some(connections) = weak.upgrade() else {
                    return;
                };
                connections
                    .lock()
                    .retain(|_, (s, used)| !s.is_closed() && used.elapsed() < CONNECTION_IDLE);
            }
        });
    }

    /// Forgets the session to a deleted sandbox.
    pub(super) fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Session, Instant)>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Refuses ids that could not be a relay's sandbox id before they reach a URL.
pub(super) fn check_id(id: &str) -> Result<(), ToolError> {
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
            tether_client::escape::escape_str(id)
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
