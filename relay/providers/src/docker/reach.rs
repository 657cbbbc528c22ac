//! Reaching a container's agent: the relay enters the container's network namespace (as it
//! does for local sandboxes' egress proxy; a root relay on the engine's host) and connects to
//! the agent's port on the container's own loopback, then upgrades to the agent's WebSocket
//! with the sandbox's token.
//!
//! Why not a published port: publishing needs the container on a bridge network, which gives
//! it the network `--network none` must deny; Docker publishes no port of an internal
//! network, and Podman's internal networks have no route from the host at all. Why not an
//! attached stream (exec): the agent serves many connections to one process table (replay,
//! background processes, forwards), and an exec'd process would be a second agent.
//!
//! The engine says which process is the container's (`State.Pid`); the relay believes it
//! only after reading, through one open `/proc/PID` directory, that the process sits in that
//! container's cgroup, and refuses a namespace that is its own. A lying engine or a recycled
//! PID therefore cannot point the relay at another process's network.

use std::fs::File;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;

use anyhow::anyhow;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use nix::sched::{setns, CloneFlags};

use super::constants::{AGENT_PORT, AGENT_URL, CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT};
use tether_relay_core::provider::upgrade::upgrade;
use tether_relay_core::provider::{AgentSocket, ProviderError};

/// The most of `/proc/PID/cgroup` read.
const MAX_CGROUP_BYTES: u64 = 64 << 10; // 64 KiB

/// Why the agent could not be reached.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReachError {
    /// Nothing listens on the agent's port yet (or any more).
    #[error("the agent does not accept connections on port {AGENT_PORT}")]
    NotListening,
    /// The process the engine named has exited meanwhile: ask the engine again.
    #[error("the container's process {0} has exited")]
    Exited(i32),
    /// The process the engine named is not the container's.
    #[error("{0}")]
    Untrusted(String),
    /// Anything else.
    #[error(transparent)]
    Other(#[from] ProviderError),
}

/// Opens an authenticated WebSocket to the agent of container `container` (its full id),
/// whose first process the engine says is `pid`.
pub(super) async fn open(
    container: &str,
    pid: i64,
    sandbox: &str,
    agent_token: &str,
) -> Result<AgentSocket, ReachError> {
    let container = container.to_string();
    let stream = tokio::task::spawn_blocking(move || connect(&container, pid))
        .await
        .map_err(|e| ProviderError::Other(anyhow!("the connecting thread failed: {e}")))??;
    stream
        .set_nonblocking(true)
        .map_err(|e| ProviderError::Other(e.into()))?;
    let stream =
        tokio::net::TcpStream::from_std(stream).map_err(|e| ProviderError::Other(e.into()))?;
    handshake(stream, sandbox, agent_token)
        .await
        .map_err(ReachError::Other)
}

/// Checks `pid` is `container`'s, then connects to the agent from inside its namespace.
fn connect(container: &str, pid: i64) -> Result<TcpStream, ReachError> {
    let ns = namespace_of(container, pid)?;
    // A thread of its own, which ends in the container's namespace and is never reused; the
    // socket stays in the namespace it was made in.
    std::thread::Builder::new()
        .name("docker-netns".into())
        .spawn(move || {
            setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|errno| {
                ProviderError::Unavailable(format!(
                    "cannot enter the container's network namespace ({errno}): the docker \
                     provider needs a relay running as root on the engine's host"
                ))
            })?;
            let agent = SocketAddr::from((Ipv4Addr::LOCALHOST, AGENT_PORT));
            match TcpStream::connect_timeout(&agent, CONNECT_TIMEOUT) {
                Ok(stream) => Ok(stream),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    Err(ReachError::NotListening)
                }
                Err(e) => Err(ProviderError::Other(anyhow!(
                    "connecting to the agent at {agent} in the container: {e}"
                ))
                .into()),
            }
        })
        .map_err(|e| ProviderError::Other(anyhow!("starting a thread: {e}")))?
        .join()
        .unwrap_or_else(|_| Err(ProviderError::Other(anyhow!("the netns thread panicked")).into()))
}

/// The network namespace of process `pid`, once it is shown to be in `container`'s cgroup.
fn namespace_of(container: &str, pid: i64) -> Result<File, ReachError> {
    let untrusted = |why: String| ReachError::Untrusted(why);
    if container.len() != 64 || !container.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(untrusted(format!(
            "the engine gave {container:?} as a container id, which is not 64 hex digits"
        )));
    }
    let pid = i32::try_from(pid)
        .ok()
        .filter(|p| *p > 1 && *p as u32 != std::process::id())
        .ok_or_else(|| untrusted(format!("the engine gave {pid} as the container's process")))?;
    // Everything below is read through this one directory, which stays the same process's
    // even if the PID is reused meanwhile (its entries then fail instead).
    let dir = File::open(format!("/proc/{pid}")).map_err(|_| ReachError::Exited(pid))?;
    let under = |name: &str| format!("/proc/self/fd/{}/{name}", dir.as_raw_fd());
    let in_container = || -> Result<bool, ReachError> {
        let mut text = String::new();
        File::open(under("cgroup"))
            .and_then(|f| f.take(MAX_CGROUP_BYTES).read_to_string(&mut text))
            .map_err(|_| ReachError::Exited(pid))?;
        Ok(text.contains(container))
    };
    if !in_container()? {
        return Err(untrusted(format!(
            "process {pid}, which the engine names as container {}'s, is not in its cgroup",
            &container[..12]
        )));
    }
    let ns = File::open(under("ns/net")).map_err(|_| ReachError::Exited(pid))?;
    if !in_container()? {
        return Err(untrusted(format!(
            "process {pid} changed while it was opened"
        )));
    }
    let ours = std::fs::metadata("/proc/thread-self/ns/net")
        .map_err(|e| ProviderError::Other(anyhow!("reading the relay's namespace: {e}")))?;
    let theirs = ns
        .metadata()
        .map_err(|e| ProviderError::Other(anyhow!("reading the container's namespace: {e}")))?;
    if (ours.dev(), ours.ino()) == (theirs.dev(), theirs.ino()) {
        return Err(untrusted(
            "the container shares the relay's network namespace; Tether's containers never do"
                .into(),
        ));
    }
    Ok(ns)
}

async fn handshake(
    stream: tokio::net::TcpStream,
    sandbox: &str,
    agent_token: &str,
) -> Result<AgentSocket, ProviderError> {
    let mut headers = HeaderMap::new();
    let bearer = HeaderValue::from_str(&format!("Bearer {agent_token}"))
        .map_err(|_| anyhow!("the agent token cannot be sent in an HTTP header"))?;
    headers.insert(AUTHORIZATION, bearer);
    let socket = tokio::time::timeout(HANDSHAKE_TIMEOUT, upgrade(stream, AGENT_URL, headers))
        .await
        .map_err(|_| {
            anyhow!(
                "the agent of sandbox {sandbox} did not answer the WebSocket handshake \
                     within {HANDSHAKE_TIMEOUT:?}"
            )
        })?
        .map_err(|e| anyhow!("the agent of sandbox {sandbox} refused the handshake: {e}"))?;
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_process_outside_the_container_is_never_entered() {
        // The relay's own process (and PID 1) are refused outright; another host process is
        // refused because its cgroup is not the container's.
        for pid in [i64::from(std::process::id()), 1, 0, -5, i64::MAX] {
            let err = namespace_of(ID, pid).unwrap_err();
            assert!(matches!(err, ReachError::Untrusted(_)), "{pid}: {err}");
        }
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let err = namespace_of(ID, i64::from(pid)).unwrap_err();
        let _ = child.kill();
        let _ = child.wait();
        assert!(err.to_string().contains("not in its cgroup"), "{err}");
        // Once it has exited, the engine is asked again rather than believed.
        let err = namespace_of(ID, i64::from(pid)).unwrap_err();
        assert!(matches!(err, ReachError::Exited(_)), "{err}");
    }

    #[test]
    fn ids_that_could_match_any_cgroup_are_refused() {
        for id in ["", "/", "0123", &"g".repeat(64)] {
            let err = namespace_of(id, 2).unwrap_err();
            assert!(err.to_string().contains("64 hex digits"), "{err}");
        }
    }
}
