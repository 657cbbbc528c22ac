//! Entering a sandbox's network namespace from a thread of the relay (`setns`, which needs a
//! root relay) to set its route and rules and to open the relay's listening sockets in it.
//! Sockets stay in the namespace they were made in, so the relay serves them from its runtime
//! like any other. The route and the rules are set by Debian's `ip` (iproute2) and `nft`
//! (nftables), run from that thread so they act on the sandbox's namespace.

use std::fs::File;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};

use ipnet::IpNet;
use nix::sched::{setns, CloneFlags};

use super::constants::EXPLICIT_PROXY_PORT;
use super::rules::{self, Ports};

/// The relay's sockets in one sandbox's network namespace.
#[derive(Debug)]
pub(super) struct Sockets {
    /// The transparent proxy, where the rules send TCP to fake addresses and allowed networks.
    pub(super) proxy: TcpListener,
    /// The explicit proxy on port 3128 (`None` if something inside already holds the port).
    pub(super) explicit: Option<TcpListener>,
    /// The DNS server over UDP.
    pub(super) dns_udp: UdpSocket,
    /// The DNS server over TCP.
    pub(super) dns_tcp: TcpListener,
}

/// Why a namespace could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The namespace is the relay's own: the sandbox shares the host's network.
    #[error(
        "sandbox {0} shares the relay's network namespace; allowlisted egress needs one of its own"
    )]
    SharedNamespace(String),
    /// setns failed.
    #[error(
        "cannot enter the network namespace of sandbox {id} ({errno}); allowlisted egress on \
         local sandboxes needs a relay running as root"
    )]
    Enter {
        /// The sandbox.
        id: String,
        /// What the kernel said.
        errno: nix::errno::Errno,
    },
    /// A host tool is missing.
    #[error("`{tool}` is not installed; allowlisted egress needs it: apt-get install {package}")]
    Missing {
        /// The command.
        tool: &'static str,
        /// The Debian package that has it.
        package: &'static str,
    },
    /// A command or system call failed.
    #[error("setting up the egress of sandbox {id}: {what}")]
    Failed {
        /// The sandbox.
        id: String,
        /// What failed, and its output.
        what: String,
    },
}

/// Sets up sandbox `id`'s namespace `ns`: default route over `lo`, the rules, and the
/// relay's sockets. Blocks (it waits for a thread and two commands): call it from
/// `spawn_blocking`.
pub(super) fn attach(id: &str, ns: File, networks: Vec<IpNet>) -> Result<Sockets, NetnsError> {
    let id = id.to_string();
    std::thread::Builder::new()
        .name("egress-netns".into())
        .spawn(move || attach_here(&id, ns, &networks))
        .map_err(|e| NetnsError::Failed {
            id: String::new(),
            what: format!("starting a thread: {e}"),
        })?
        .join()
        .unwrap_or_else(|_| {
            Err(NetnsError::Failed {
                id: String::new(),
                what: "the namespace thread panicked".into(),
            })
        })
}

/// Runs on a thread of its own, which ends in the sandbox's namespace (never reused).
fn attach_here(id: &str, ns: File, networks: &[IpNet]) -> Result<Sockets, NetnsError> {
    let failed = |what: String| NetnsError::Failed {
        id: id.to_string(),
        what,
    };
    let ours = std::fs::metadata("/proc/thread-self/ns/net")
        .map_err(|e| failed(format!("reading the relay's network namespace: {e}")))?;
    let theirs = ns
        .metadata()
        .map_err(|e| failed(format!("reading the sandbox's network namespace: {e}")))?;
    if (ours.dev(), ours.ino()) == (theirs.dev(), theirs.ino()) {
        return Err(NetnsError::SharedNamespace(id.to_string()));
    }
    setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|errno| NetnsError::Enter {
        id: id.to_string(),
        errno,
    })?;
    let loopback = |port| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let bind = |what: &str, port| {
        TcpListener::bind(loopback(port)).map_err(|e| failed(format!("listening for {what}: {e}")))
    };
    let proxy = bind("the proxy", 0)?;
    let dns_tcp = bind("DNS over TCP", 0)?;
    let dns_udp =
        UdpSocket::bind(loopback(0)).map_err(|e| failed(format!("opening the DNS socket: {e}")))?;
    let explicit = match TcpListener::bind(loopback(EXPLICIT_PROXY_PORT)) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(
                sandbox = id,
                "cannot listen on 127.0.0.1:{EXPLICIT_PROXY_PORT} in the sandbox ({e}); only the \
                 transparent proxy serves it"
            );
            None
        }
    };
    for socket in [&proxy, &dns_tcp] {
        socket
            .set_nonblocking(true)
            .map_err(|e| failed(e.to_string()))?;
    }
    if let Some(l) = &explicit {
        l.set_nonblocking(true).map_err(|e| failed(e.to_string()))?;
    }
    dns_udp
        .set_nonblocking(true)
        .map_err(|e| failed(e.to_string()))?;
    let port = |l: &TcpListener| l.local_addr().map(|a| a.port()).unwrap_or(0);
    let ports = Ports {
        dns_udp: dns_udp.local_addr().map(|a| a.port()).unwrap_or(0),
        dns_tcp: port(&dns_tcp),
        proxy: port(&proxy),
    };
    run(
        id,
        ("ip", "iproute2"),
        // The source must be given: no address of `lo` has a scope that a default route may
        // use, so connections would leave from 0.0.0.0 and replies never match them.
        &[
            "-4",
            "route",
            "replace",
            "default",
            "dev",
            "lo",
            "src",
            "127.0.0.1",
        ],
        None,
    )?;
    run(
        id,
        ("nft", "nftables"),
        &["-f", "-"],
        Some(&rules::script(ports, networks)),
    )?;
    Ok(Sockets {
        proxy,
        explicit,
        dns_udp,
        dns_tcp,
    })
}

/// Runs `tool args` in this thread's namespace, with `input` on its stdin.
fn run(
    id: &str,
    (tool, package): (&'static str, &'static str),
    args: &[&str],
    input: Option<&str>,
) -> Result<(), NetnsError> {
    let mut child = match Command::new(tool)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(NetnsError::Missing { tool, package })
        }
        Err(e) => {
            return Err(NetnsError::Failed {
                id: id.to_string(),
                what: format!("running {tool}: {e}"),
            })
        }
    };
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        let _ = stdin.write_all(text.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| NetnsError::Failed {
        id: id.to_string(),
        what: format!("waiting for {tool}: {e}"),
    })?;
    if !out.status.success() {
        return Err(NetnsError::Failed {
            id: id.to_string(),
            what: format!(
                "`{tool} {}` failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(())
}
