//! Entering a sandbox's network namespace from a thread of the relay (`setns`, which needs a
//! root relay) to set its route and rules and to open the relay's listening sockets in it.
//! Sockets stay in the namespace they were made in, so the relay serves them from its runtime
//! like any other. The route and the rules are set by Debian's `ip` (iproute2) and `nft`
//! (nftables), run from that thread so they act on the sandbox's namespace.
//!
//! A sandbox with IPv4 networks to reach keeps that thread (one per sandbox) as its
//! `Opener`: UDP replies must leave from sockets made in the namespace, one per flow, and
//! only a thread inside can make them. The thread ends when its `Opener` is dropped.

use std::fs::File;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;

use ipnet::IpNet;
use nix::sched::{setns, CloneFlags};
use nix::sys::socket::{
    bind, connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
};
use tokio::sync::oneshot;

use super::constants::EXPLICIT_PROXY_PORT;
use super::rules::{self, Ports, UDP_MARK, UDP_RULE_PRIORITY, UDP_TABLE};

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
    /// Where the rules hand UDP to allowed networks, and the thread that opens the sockets
    /// its replies leave from (`None` without IPv4 networks).
    pub(super) udp: Option<(UdpSocket, Opener)>,
}

/// A request to the namespace's thread: a reply socket for one UDP flow.
struct Open {
    /// The address the sandbox sent to, which replies must come from.
    local: SocketAddrV4,
    /// The sandbox's socket, which replies go to.
    peer: SocketAddrV4,
    answer: oneshot::Sender<std::io::Result<UdpSocket>>,
}

/// Opens UDP sockets in one sandbox's namespace, on the thread that entered it.
#[derive(Debug)]
pub(super) struct Opener {
    requests: mpsc::SyncSender<Open>,
}

impl Opener {
    /// A socket in the namespace bound to `local` (an address of no interface there, which
    /// `IP_TRANSPARENT` allows) and connected to `peer`: what it sends reaches `peer` as if
    /// from `local`, and the rules' TPROXY gives it `peer`'s later datagrams to `local`.
    pub(super) async fn reply_socket(
        &self,
        local: SocketAddrV4,
        peer: SocketAddrV4,
    ) -> std::io::Result<UdpSocket> {
        let (answer, answered) = oneshot::channel();
        let gone = || std::io::Error::other("the sandbox's namespace thread has ended");
        self.requests
            .try_send(Open {
                local,
                peer,
                answer,
            })
            .map_err(|_| gone())?;
        answered.await.map_err(|_| gone())?
    }
}

/// A UDP socket with `IP_TRANSPARENT` bound to `local`: it may bind an address the namespace
/// does not have, and receive what TPROXY hands it. `orig_dst` asks for each datagram's
/// original destination (`IP_RECVORIGDSTADDR`); `peer` connects it. Non-blocking.
fn transparent_udp(
    local: SocketAddrV4,
    orig_dst: bool,
    peer: Option<SocketAddrV4>,
) -> std::io::Result<UdpSocket> {
    let fd = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    setsockopt(&fd, sockopt::IpTransparent, &true)?;
    // Flows from several sandbox sockets to one address each bind that address.
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    if orig_dst {
        setsockopt(&fd, sockopt::Ipv4OrigDstAddr, &true)?;
    }
    bind(fd.as_raw_fd(), &SockaddrIn::from(local))?;
    if let Some(peer) = peer {
        connect(fd.as_raw_fd(), &SockaddrIn::from(peer))?;
    }
    Ok(UdpSocket::from(fd))
}

/// Serves an [`Opener`]'s requests on this thread (in the sandbox's namespace) until it is
/// dropped.
fn serve_opener(requests: mpsc::Receiver<Open>) {
    while let Ok(open) = requests.recv() {
        let _ = open
            .answer
            .send(transparent_udp(open.local, false, Some(open.peer)));
    }
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
/// relay's sockets. Blocks (it waits for a thread and a few commands): call it from
/// `spawn_blocking`.
pub(super) fn attach(id: &str, ns: File, networks: Vec<IpNet>) -> Result<Sockets, NetnsError> {
    let (done, result) = mpsc::sync_channel(1);
    let thread_id = id.to_string();
    std::thread::Builder::new()
        .name("egress-netns".into())
        .spawn(move || {
            let (opened, requests) = match attach_here(&thread_id, ns, &networks) {
                Ok((sockets, requests)) => (Ok(sockets), requests),
                Err(e) => (Err(e), None),
            };
            let _ = done.send(opened);
            if let Some(requests) = requests {
                serve_opener(requests);
            }
        })
        .map_err(|e| NetnsError::Failed {
            id: id.to_string(),
            what: format!("starting a thread: {e}"),
        })?;
    result.recv().unwrap_or_else(|_| {
        Err(NetnsError::Failed {
            id: id.to_string(),
            what: "the namespace thread panicked".into(),
        })
    })
}

/// Runs on a thread of its own, which ends in the sandbox's namespace (never reused); returns
/// the sockets, and the requests of their [`Opener`] for the thread to serve.
fn attach_here(
    id: &str,
    ns: File,
    networks: &[IpNet],
) -> Result<(Sockets, Option<mpsc::Receiver<Open>>), NetnsError> {
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
    let udp = if networks.iter().any(|n| matches!(n, IpNet::V4(_))) {
        let socket = transparent_udp(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), true, None)
            .map_err(|e| failed(format!("opening the transparent UDP socket: {e}")))?;
        Some(socket)
    } else {
        None
    };
    let port = |l: &TcpListener| l.local_addr().map(|a| a.port()).unwrap_or(0);
    let udp_port = |s: &UdpSocket| s.local_addr().map(|a| a.port()).unwrap_or(0);
    let ports = Ports {
        dns_udp: udp_port(&dns_udp),
        dns_tcp: port(&dns_tcp),
        proxy: port(&proxy),
        udp: udp.as_ref().map(udp_port),
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
    if udp.is_some() {
        route_marked_udp_locally(id)?;
    }
    run(
        id,
        ("nft", "nftables"),
        &["-f", "-"],
        Some(&rules::script(ports, networks)),
    )?;
    let (udp, requests) = match udp {
        Some(socket) => {
            // One request at a time: the relay waits for each socket before asking again.
            let (requests, received) = mpsc::sync_channel(1);
            (Some((socket, Opener { requests })), Some(received))
        }
        None => (None, None),
    };
    let sockets = Sockets {
        proxy,
        explicit,
        dns_udp,
        dns_tcp,
        udp,
    };
    Ok((sockets, requests))
}

/// The policy route of UDP the rules mark for the relay: every destination local, so it loops
/// back through `lo` to the namespace's TPROXY rule. Both commands may have run in this
/// namespace before (a relay restarting: `nft flush ruleset` leaves routes and rules), so
/// the route is replaced and an existing rule kept.
fn route_marked_udp_locally(id: &str) -> Result<(), NetnsError> {
    let table = UDP_TABLE.to_string();
    run(
        id,
        ("ip", "iproute2"),
        &[
            "-4",
            "route",
            "replace",
            "local",
            "0.0.0.0/0",
            "dev",
            "lo",
            "table",
            &table,
        ],
        None,
    )?;
    let (mark, priority) = (format!("{UDP_MARK:#x}"), UDP_RULE_PRIORITY.to_string());
    let rule = [
        "-4", "rule", "add", "priority", &priority, "fwmark", &mark, "lookup", &table,
    ];
    match run(id, ("ip", "iproute2"), &rule, None) {
        Err(NetnsError::Failed { what, .. }) if what.contains("File exists") => Ok(()),
        other => other,
    }
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
