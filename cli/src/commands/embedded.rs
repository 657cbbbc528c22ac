//! The relay `tether run` uses: the configured one, the local one if it answers, or else one
//! embedded in the process for the run's duration, on a free loopback port with a private
//! data directory that is removed afterwards. This is what lets `tether run` work on a
//! machine where nothing was set up.

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::Context;

use super::remote::Remote;
use super::serve;
use tether_relay::{
    self as server, PolicyConfig, RelayConfig, RunningRelay, DEFAULT_LISTEN, DEFAULT_REAP_INTERVAL,
};

/// How long to wait for the default relay to accept a connection. On loopback a relay
/// accepts in microseconds and a closed port refuses at once; this only bounds oddities.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// Where `tether run`'s relay comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Source {
    /// `--relay` or `TETHER_RELAY` named one: use it, and fail if it is down.
    Configured(String),
    /// Nothing was configured and the default local relay answers.
    Running(String),
    /// Start one in this process.
    Embedded,
}

/// Decides where the relay comes from. `flag` is `--relay`, `env` is `TETHER_RELAY`,
/// `forced` is `--embedded`; `answers` probes an address.
pub(super) fn choose(
    flag: Option<&str>,
    env: Option<&str>,
    forced: bool,
    answers: impl FnOnce(SocketAddr) -> bool,
) -> anyhow::Result<Source> {
    match (flag, forced) {
        (Some(_), true) => {
            anyhow::bail!("--embedded starts a private relay, so it cannot be used with --relay")
        }
        (_, true) => Ok(Source::Embedded),
        (Some(url), false) => Ok(Source::Configured(url.to_string())),
        (None, false) => match env.filter(|e| !e.is_empty()) {
            Some(url) => Ok(Source::Configured(url.to_string())),
            None if answers(DEFAULT_LISTEN) => {
                Ok(Source::Running(format!("http://{DEFAULT_LISTEN}")))
            }
            None => Ok(Source::Embedded),
        },
    }
}

/// Whether something accepts TCP connections at `addr`.
pub(super) fn answers(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).is_ok()
}

/// A relay running inside this process, and its private data directory.
pub(super) struct Embedded {
    relay: RunningRelay,
    data_dir: tempfile::TempDir,
}

impl Embedded {
    /// Starts a relay on a free loopback port; returns it and how to reach it.
    pub(super) async fn start() -> anyhow::Result<(Embedded, Remote)> {
        let data_dir = tempfile::Builder::new()
            .prefix("tether-run-")
            .tempdir()
            .context("cannot create a data directory for the embedded relay")?;
        let config = RelayConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: data_dir.path().to_path_buf(),
            agent_binary: serve::agent_binary()?,
            reap_interval: DEFAULT_REAP_INTERVAL,
            // A private relay of the user at the keyboard: any of their directories may be an
            // image, as `tether run --image DIR` promises (its data directory still may not).
            policy: PolicyConfig {
                image_roots: vec!["/".into()],
                ..Default::default()
            },
            tls: None,
            egress: Default::default(),
            docker_host: None,
            connections: Default::default(),
            database: Default::default(),
            advertise: None,
            preview_domain: None,
        };
        let relay = server::start(config)
            .await
            .context("cannot start the embedded relay")?;
        let remote = Remote::new(&relay.url(), Some(relay.admin_token.clone()))?;
        Ok((Embedded { relay, data_dir }, remote))
    }

    /// Shuts the relay down and removes its data directory.
    pub(super) async fn stop(self) {
        self.relay.shutdown().await;
        let path = self.data_dir.path().to_path_buf();
        if let Err(e) = self.data_dir.close() {
            tracing::warn!(
                "cannot remove the embedded relay's data directory {}: {e}",
                path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_client::DEFAULT_RELAY;

    #[test]
    fn the_probe_is_the_clients_default() {
        assert_eq!(format!("http://{DEFAULT_LISTEN}"), DEFAULT_RELAY);
    }

    #[test]
    fn configured_relays_are_used_without_probing() {
        let never = |_| panic!("probed a configured relay");
        let flag = choose(Some("http://a:1"), Some("http://b:2"), false, never).unwrap();
        assert_eq!(flag, Source::Configured("http://a:1".into()));
        let env = choose(None, Some("http://b:2"), false, never).unwrap();
        assert_eq!(env, Source::Configured("http://b:2".into()));
    }

    #[test]
    fn the_default_relay_is_used_when_it_answers() {
        let running = choose(None, None, false, |addr| addr == DEFAULT_LISTEN).unwrap();
        assert_eq!(running, Source::Running(DEFAULT_RELAY.into()));
        assert_eq!(
            choose(None, Some(""), false, |_| false).unwrap(),
            Source::Embedded
        );
    }

    #[test]
    fn embedded_when_nothing_answers_or_when_forced() {
        assert_eq!(
            choose(None, None, false, |_| false).unwrap(),
            Source::Embedded
        );
        let forced = choose(None, Some("http://b:2"), true, |_| true).unwrap();
        assert_eq!(forced, Source::Embedded);
        assert!(choose(Some("http://a:1"), None, true, |_| true).is_err());
    }

    #[test]
    fn probing_tells_open_from_closed_ports() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(answers(listener.local_addr().unwrap()));
        // A port bound but not listening refuses connections and, unlike a port just freed,
        // cannot be taken meanwhile by another test's listener.
        let closed = tokio::net::TcpSocket::new_v4().unwrap();
        closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        assert!(!answers(closed.local_addr().unwrap()));
    }
}
