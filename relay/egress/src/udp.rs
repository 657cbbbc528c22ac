//! UDP from a local sandbox to its allowed networks. The rules hand each datagram to the
//! relay's transparent socket in the sandbox's namespace with its original destination
//! (TPROXY, see [`super::rules`]); the relay sends it on from its own namespace and the
//! replies back from that destination's address, so a connected socket inside (`nc -u`, a
//! resolver client) sees the peer it sent to.
//!
//! A flow is one sandbox socket and one destination. It holds two connected sockets: one in
//! the relay's namespace to the destination, one made in the sandbox's namespace (by its
//! [`Opener`]) bound to the destination's address and connected to the sandbox's socket,
//! which TPROXY also gives the flow's later datagrams. Flows are capped per sandbox and end
//! when idle; every refusal is logged as the TCP proxy's are.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::socket::{recvmsg, send, ControlMessageOwned, MsgFlags, SockaddrIn};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use super::constants::{MAX_DATAGRAM_BYTES, MAX_UDP_FLOWS, UDP_FLOW_IDLE_TIMEOUT};
use super::netns::Opener;
use super::policy::Allowlist;
use super::reach;

/// One flow: the sandbox's socket and where it sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FlowKey {
    client: SocketAddrV4,
    dest: SocketAddrV4,
}

/// The flows of one sandbox.
#[derive(Debug, Default)]
struct Flows {
    /// Each flow's socket to its destination.
    outward: HashMap<FlowKey, Arc<UdpSocket>>,
    /// Whether the cap's refusal was logged since it was last below the cap (one line per
    /// flood, not per datagram).
    full_logged: bool,
}

/// One sandbox's UDP relay.
#[derive(Debug)]
pub(super) struct Udp {
    /// The sandbox, for the log.
    id: String,
    /// What it may reach.
    allowlist: Arc<Allowlist>,
    /// Makes the sockets replies leave from, in its namespace.
    opener: Opener,
    flows: Mutex<Flows>,
}

impl Udp {
    /// The relay of sandbox `id`, whose namespace `opener` makes sockets in.
    pub(super) fn new(id: String, allowlist: Arc<Allowlist>, opener: Opener) -> Self {
        Udp {
            id,
            allowlist,
            opener,
            flows: Mutex::new(Flows::default()),
        }
    }

    fn refuse(&self, what: &str, why: &str) {
        tracing::info!(sandbox = %self.id, what, why, "egress refused");
    }

    fn flows(&self) -> std::sync::MutexGuard<'_, Flows> {
        self.flows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves the transparent socket `listener` (which reports original destinations) until
    /// `stop`: each datagram starts a flow or joins the one it belongs to.
    pub(super) async fn serve(self: Arc<Self>, listener: UdpSocket, stop: CancellationToken) {
        let mut buf = vec![0u8; MAX_DATAGRAM_BYTES];
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                ready = listener.readable() => if ready.is_err() { return },
            }
            let got = listener.try_io(Interest::READABLE, || {
                recv_with_destination(&listener, &mut buf)
            });
            match got {
                Ok(Some((n, key))) => self.clone().datagram(&buf[..n], key, &stop).await,
                Ok(None) => self.refuse("a datagram", "its original destination is unknown"),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => tracing::debug!(sandbox = %self.id, "UDP socket: {e}"),
            }
        }
    }

    /// A datagram the rules handed over: sent on through its flow, started if need be.
    async fn datagram(self: Arc<Self>, data: &[u8], key: FlowKey, stop: &CancellationToken) {
        let known = self.flows().outward.get(&key).cloned();
        if let Some(outward) = known {
            // A datagram that came before its flow's reply socket existed.
            return send_now(&outward, data);
        }
        let ip = *key.dest.ip();
        let refused = if key.dest.port() == 53 {
            Some("port 53 is the relay's DNS server".to_string())
        } else if !self.allowlist.allows_addr(IpAddr::V4(ip)) {
            Some("the address is in no allowed network".to_string())
        } else {
            // The same filter as TCP's: never the relay's host, its fake addresses, broadcast.
            reach::shared()
                .check(IpAddr::V4(ip), &self.allowlist.networks, false)
                .err()
                .map(|why| why.to_string())
        };
        if let Some(why) = refused {
            return self.refuse(&key.dest.to_string(), &why);
        }
        {
            let mut flows = self.flows();
            if flows.outward.len() >= MAX_UDP_FLOWS {
                if !flows.full_logged {
                    flows.full_logged = true;
                    drop(flows);
                    self.refuse(
                        &key.dest.to_string(),
                        "every UDP flow slot is taken; datagrams starting new flows are dropped \
                         until one goes idle",
                    );
                }
                return;
            }
        }
        let (outward, reply) = match self.open(key).await {
            Ok(sockets) => sockets,
            Err(e) => {
                return self.refuse(&key.dest.to_string(), &format!("cannot open a flow: {e}"))
            }
        };
        send_now(&outward, data);
        let outward = Arc::new(outward);
        self.flows().outward.insert(key, outward.clone());
        let (udp, stop) = (self.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = relay_flow(&reply, &outward, UDP_FLOW_IDLE_TIMEOUT) => {}
            }
            udp.forget(key);
        });
    }

    /// The flow's two sockets: to its destination from the relay's namespace, and to its
    /// client from the destination's address in the sandbox's.
    async fn open(&self, key: FlowKey) -> io::Result<(UdpSocket, UdpSocket)> {
        let outward = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        outward.connect(key.dest)?;
        outward.set_nonblocking(true)?;
        let reply = self.opener.reply_socket(key.dest, key.client).await?;
        Ok((UdpSocket::from_std(outward)?, UdpSocket::from_std(reply)?))
    }

    fn forget(&self, key: FlowKey) {
        let mut flows = self.flows();
        flows.outward.remove(&key);
        flows.full_logged = false;
    }
}

/// Reads one datagram from the transparent socket into `buf`: its length, its sender and
/// where it was going (`None` when the kernel did not say, which TPROXY always does).
fn recv_with_destination(
    socket: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<Option<(usize, FlowKey)>> {
    let mut space = nix::cmsg_space!(nix::libc::sockaddr_in);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = recvmsg::<SockaddrIn>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_DONTWAIT,
    )?;
    let client = msg.address.map(SocketAddrV4::from);
    let dest = msg.cmsgs()?.find_map(|c| match c {
        ControlMessageOwned::Ipv4OrigDstAddr(addr) => {
            Some(SocketAddrV4::from(SockaddrIn::from(addr)))
        }
        _ => None,
    });
    Ok(client
        .zip(dest)
        .map(|(client, dest)| (msg.bytes, FlowKey { client, dest })))
}

/// Sends `data` on the connected `socket` if it can take it now, else drops it, as a full
/// queue drops a datagram: the relay never waits on a sender. (Tokio's `try_send` would also
/// drop it on a new socket whose readiness the runtime has not been told yet.)
fn send_now(socket: &UdpSocket, data: &[u8]) {
    let _ = send(socket.as_raw_fd(), data, MsgFlags::MSG_DONTWAIT);
}

/// Moves datagrams between a flow's two connected sockets, `inner` (the sandbox's side) and
/// `outer` (the destination's), until neither has one for `idle`. One buffer serves both
/// ways; a datagram a socket cannot take at once is dropped, as a full queue drops it.
async fn relay_flow(inner: &UdpSocket, outer: &UdpSocket, idle: Duration) {
    let mut buf = vec![0u8; MAX_DATAGRAM_BYTES];
    loop {
        let ready = tokio::time::timeout(idle, async {
            tokio::select! {
                r = inner.readable() => r.map(|()| true),
                r = outer.readable() => r.map(|()| false),
            }
        })
        .await;
        let (from, to) = match ready {
            // Idle, or a socket the runtime lost.
            Err(_) | Ok(Err(_)) => return,
            Ok(Ok(true)) => (inner, outer),
            Ok(Ok(false)) => (outer, inner),
        };
        // An error is a spurious wake (WouldBlock) or an ICMP error reported on the connected
        // socket (the peer's port is closed): either way the flow lives on until idle.
        if let Ok(n) = from.try_recv(&mut buf) {
            send_now(to, &buf[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        a.connect(b.local_addr().unwrap()).await.unwrap();
        b.connect(a.local_addr().unwrap()).await.unwrap();
        (a, b)
    }

    #[tokio::test]
    async fn a_flow_moves_datagrams_both_ways_and_ends_when_idle() {
        // sandbox <-> inner ... outer <-> upstream
        let (sandbox, inner) = pair().await;
        let (outer, upstream) = pair().await;
        let idle = Duration::from_millis(300);
        let flow = tokio::spawn(async move { relay_flow(&inner, &outer, idle).await });
        let mut buf = [0u8; 64];
        for i in 0..3u8 {
            sandbox.send(&[b'q', i]).await.unwrap();
            let n = upstream.recv(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], &[b'q', i]);
            upstream.send(&[b'r', i]).await.unwrap();
            let n = sandbox.recv(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], &[b'r', i]);
        }
        // An upstream that went away (ICMP port unreachable) does not end the flow early.
        drop(upstream);
        sandbox.send(b"nobody").await.unwrap();
        let started = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(10), flow)
            .await
            .expect("the idle flow ended")
            .unwrap();
        assert!(started.elapsed() >= idle / 2, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn the_largest_datagram_passes_whole() {
        let (sandbox, inner) = pair().await;
        let (outer, upstream) = pair().await;
        tokio::spawn(async move { relay_flow(&inner, &outer, Duration::from_secs(10)).await });
        let big = vec![7u8; 65_507];
        sandbox.send(&big).await.unwrap();
        let mut buf = vec![0u8; MAX_DATAGRAM_BYTES];
        let n = upstream.recv(&mut buf).await.unwrap();
        assert_eq!(n, big.len());
    }
}
