//! The Docker Engine API client: which socket (`--docker-host`, else `DOCKER_HOST`, else
//! [`DEFAULT_SOCKET`]), and what its failures mean to a user. Only Unix sockets: the relay
//! reaches a sandbox's agent inside the container's network namespace, which only works
//! for an engine on the relay's own host.

use std::path::PathBuf;

use bollard::errors::Error as EngineError;
use bollard::Docker;

use super::constants::{API_TIMEOUT_SECS, DEFAULT_SOCKET};
use tether_relay_core::provider::ProviderError;

/// Where the engine listens.
#[derive(Clone, Debug)]
pub(crate) struct Host {
    /// The socket's path.
    pub(crate) socket: PathBuf,
}

impl Host {
    /// `explicit` (`tether serve --docker-host`), else `DOCKER_HOST`, else the default.
    /// A host that is not a Unix socket is refused with what to do instead.
    pub(crate) fn resolve(explicit: Option<&str>) -> Result<Host, String> {
        let env = std::env::var("DOCKER_HOST").ok().filter(|v| !v.is_empty());
        let (given, from) = match (explicit, env.as_deref()) {
            (Some(h), _) => (h.to_string(), "--docker-host"),
            (None, Some(h)) => (h.to_string(), "DOCKER_HOST"),
            (None, None) => (format!("unix://{DEFAULT_SOCKET}"), "the default"),
        };
        Host::parse(&given).map_err(|why| format!("{from} {given:?}: {why}"))
    }

    /// `unix:///path` or `/path`.
    pub(crate) fn parse(given: &str) -> Result<Host, String> {
        let path = given.strip_prefix("unix://").unwrap_or(given);
        if given.contains("://") && !given.starts_with("unix://") {
            return Err(
                "the docker provider speaks to a local engine over its Unix socket \
                 only (unix:///var/run/docker.sock, or podman's unix:///run/podman/podman.sock); \
                 run the relay on the engine's host"
                    .into(),
            );
        }
        if !path.starts_with('/') {
            return Err("give the socket's absolute path, as unix:///PATH".into());
        }
        Ok(Host {
            socket: PathBuf::from(path),
        })
    }

    /// A client for the engine. Cheap: nothing is sent until a call.
    pub(crate) fn client(&self) -> Result<Docker, ProviderError> {
        let path = self.socket.to_string_lossy();
        Docker::connect_with_unix(&path, API_TIMEOUT_SECS, bollard::API_DEFAULT_VERSION)
            .map_err(|e| self.unreachable(&e))
    }

    fn unreachable(&self, e: &EngineError) -> ProviderError {
        ProviderError::Unavailable(format!(
            "no Docker engine answers at {} ({e}): start Docker, or Podman's service \
             (`podman system service --time=0 unix://{}`), or point the relay at the engine's \
             socket with `tether serve --docker-host unix:///PATH` (or DOCKER_HOST)",
            self.socket.display(),
            self.socket.display()
        ))
    }

    /// A failed call as the user should read it; `what` says what was being done.
    pub(crate) fn error(&self, what: &str, e: EngineError) -> ProviderError {
        match &e {
            EngineError::SocketNotFoundError(_)
            | EngineError::HyperResponseError { .. }
            | EngineError::IOError { .. }
            | EngineError::RequestTimeoutError => self.unreachable(&e),
            EngineError::DockerResponseServerError {
                status_code,
                message,
            } => ProviderError::Other(anyhow::anyhow!(
                "{what}: the engine answered HTTP {status_code}: {}",
                message.trim()
            )),
            _ => ProviderError::Other(anyhow::anyhow!("{what}: {e}")),
        }
    }
}

/// The HTTP status of an engine's refusal, if it was one.
pub(crate) fn status(e: &EngineError) -> Option<u16> {
    match e {
        EngineError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unix_sockets_are_taken() {
        assert_eq!(
            Host::parse("unix:///run/podman/podman.sock")
                .unwrap()
                .socket,
            PathBuf::from("/run/podman/podman.sock")
        );
        assert_eq!(
            Host::parse("/var/run/docker.sock").unwrap().socket,
            PathBuf::from("/var/run/docker.sock")
        );
        let tcp = Host::parse("tcp://10.0.0.1:2375").unwrap_err();
        assert!(tcp.contains("Unix socket"), "{tcp}");
        let relative = Host::parse("unix://docker.sock").unwrap_err();
        assert!(relative.contains("absolute"), "{relative}");
    }
}
