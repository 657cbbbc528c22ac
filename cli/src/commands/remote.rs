//! Which relay the CLI talks to and as whom: the address from `--relay` or `TETHER_RELAY`,
//! the token from `TETHER_TOKEN` or the local relay's admin token file; and every client
//! error turned into a sentence that says what to do next (the CLI's one door to the relay:
//! [`Remote::rest`] and [`Remote::connect`] are the only ways its commands reach it).

use anyhow::anyhow;

use tether_client::{local, ClientError, RelayClient, Session};

/// A relay and the token to present to it.
#[derive(Clone, Debug)]
pub(super) struct Remote {
    base: String,
    token: Option<String>,
}

impl Remote {
    /// The relay named by `flag`, else `TETHER_RELAY`, else the default local one.
    pub(super) fn resolve(flag: Option<&str>) -> anyhow::Result<Remote> {
        Remote::new(&local::relay_address(flag), local::token())
    }

    /// A relay at `base` (`http://host:port`).
    pub(super) fn new(base: &str, token: Option<String>) -> anyhow::Result<Remote> {
        let base = local::check_relay_address(base).map_err(|e| anyhow!(e))?;
        Ok(Remote { base, token })
    }

    /// A REST client. Built only by commands that use REST: it loads TLS roots, which
    /// `exec` cannot afford on its fast path.
    pub(super) fn rest(&self) -> anyhow::Result<RelayClient> {
        RelayClient::new(&self.base, self.token.clone()).map_err(|e| self.explain(e, None))
    }

    /// Opens a protocol session to sandbox `id` straight through the relay's tunnel, with no
    /// REST call first: a missing sandbox is the tunnel's 404.
    pub(super) async fn connect(&self, id: &str) -> anyhow::Result<Session> {
        let ws = format!(
            "{}/v1/sandboxes/{id}/ws",
            self.base.replacen("http", "ws", 1)
        );
        Session::connect(&ws, self.token.as_deref())
            .await
            .map_err(|e| self.explain(e, Some(id)))
    }

    /// Turns a client error into one that says what to do; `id` is the sandbox concerned.
    pub(super) fn explain(&self, err: ClientError, id: Option<&str>) -> anyhow::Error {
        match err {
            ClientError::Http { status: 404, .. } if id.is_some() => anyhow!(
                "no sandbox {} at {}: list yours with `tether ls`",
                id.unwrap_or_default(),
                self.base
            ),
            ClientError::Http {
                status: 401,
                message,
                ..
            } => match &self.token {
                None => anyhow!(
                    "the relay at {} wants a token and none is set: set TETHER_TOKEN to one \
                     from `tether token create`, or to the relay's admin token (DIR/admin.token \
                     for a relay started with --data-dir DIR; none was found at {}, where a \
                     relay on this machine keeps it by default)",
                    self.base,
                    local::admin_token_path().display()
                ),
                // The relay's message already says what to set.
                Some(_) => anyhow!("the relay at {} refused the token: {message}", self.base),
            },
            // What only the CLI words: the command to run next.
            other @ (ClientError::Connect { .. }
            | ClientError::Interrupted { .. }
            | ClientError::NotRelay { .. }
            | ClientError::Disconnected
            | ClientError::PeerSilent { .. }) => {
                anyhow!(crate::advice::sentence(&other, Some(&self.base)))
            }
            // The rest keep their type: exit statuses and contexts are read from it.
            other => anyhow!(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote() -> Remote {
        Remote::new("http://127.0.0.1:9/", None).unwrap()
    }

    #[test]
    fn addresses_need_a_scheme_and_lose_the_trailing_slash() {
        assert_eq!(remote().base, "http://127.0.0.1:9");
        assert!(Remote::new("127.0.0.1:7420", None).is_err());
    }

    #[test]
    fn an_unreachable_relay_says_how_to_get_one() {
        let err = remote().explain(
            ClientError::Connect {
                url: "x".into(),
                reason: "Connection refused (os error 111)".into(),
            },
            None,
        );
        assert_eq!(
            err.to_string(),
            "no relay at http://127.0.0.1:9: start one with `tether serve` (or use `tether \
             run`, which needs none)"
        );
    }

    #[test]
    fn a_relay_gone_mid_request_is_not_called_a_missing_relay() {
        let err = remote().explain(
            ClientError::Interrupted {
                url: "x".into(),
                reason: "connection closed before message completed".into(),
            },
            None,
        );
        let said = err.to_string();
        assert!(!said.contains("no relay at"), "{said}");
        assert!(!said.contains("tether serve"), "{said}");
        assert!(
            said.contains("went away in the middle of the request"),
            "{said}"
        );
        assert!(
            said.contains("may exist") && said.contains("`tether ls`"),
            "{said}"
        );
    }

    #[test]
    fn a_tls_failure_is_not_called_a_missing_relay() {
        let err = ClientError::Tls {
            url: "https://relay:7420".into(),
            reason: "the relay's certificate is not trusted (UnknownIssuer); set TETHER_CA_CERT"
                .into(),
        };
        let msg = remote().explain(err, Some("sb-1")).to_string();
        assert!(!msg.contains("tether serve"), "{msg}");
        assert!(msg.contains("TETHER_CA_CERT"), "{msg}");
    }

    #[test]
    fn a_missing_sandbox_points_at_ls() {
        let err = ClientError::Http {
            status: 404,
            code: "not_found".into(),
            message: "x".into(),
        };
        let msg = remote().explain(err, Some("sb-1")).to_string();
        assert!(msg.starts_with("no sandbox sb-1 at"), "{msg}");
        assert!(msg.contains("tether ls"), "{msg}");
    }
}
