//! Every tunable of the egress proxy, with its unit.

use std::time::Duration;

/// Names one sandbox may have fake addresses for (the pool holds 131,070).
pub(super) const MAX_FAKE_NAMES: usize = 65_536;

/// Connections one sandbox may have open through the proxy at once (transparent and explicit
/// together); more wait for one to close.
pub(super) const MAX_CONNECTIONS: usize = 256;

/// Bytes buffered per direction of a proxied connection: 64 KiB (tokio's default 8 KiB costs
/// a third of the throughput on loopback; 256 connections use at most 32 MiB).
pub(super) const COPY_BUFFER_BYTES: usize = 64 * 1024;

/// DNS-over-TCP connections one sandbox may have open at once.
pub(super) const MAX_DNS_CONNECTIONS: usize = 16;

/// Largest request head (request line and headers) the proxy reads: 16 KiB.
pub(super) const MAX_HEAD_BYTES: usize = 16 * 1024;

/// How long the proxy waits for a request head or a TLS ClientHello before it gives up.
pub(super) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the proxy waits for a client's first bytes before treating the connection as a
/// protocol where the server speaks first (SMTP, SSH banners): those pass after this delay.
pub(super) const FIRST_BYTES_WAIT: Duration = Duration::from_millis(300);

/// How long an allowed connection may go without a byte moving either way before the proxy
/// closes it (once it is past its first message): 15 minutes, longer than any keep-alive an
/// HTTP client or an SSH session with keep-alives leaves between packets.
pub(super) const TUNNEL_IDLE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// How long a connection to an upstream may take, per address tried.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a DNS-over-TCP client may stay silent.
pub(super) const DNS_TCP_TIMEOUT: Duration = Duration::from_secs(10);

/// Time to live of the fake addresses in DNS answers, in seconds.
pub(super) const DNS_TTL_SECS: u32 = 60;

/// UDP flows (a sandbox socket and an address in an allowed network) one sandbox may have at
/// once; a datagram that would start another is dropped until one ends. Each holds two
/// sockets and a 64 KiB buffer: 512 descriptors and 16 MiB at most.
pub(super) const MAX_UDP_FLOWS: usize = 256;

/// How long a UDP flow may go without a datagram either way before it ends (its sockets
/// close; a later datagram starts it again): 60 s, past any DNS or NTP exchange and twice the
/// keep-alive of protocols that send them (WireGuard's is 25 s).
pub(super) const UDP_FLOW_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest UDP datagram relayed: 64 KiB, so none is ever cut (IPv4's largest payload is
/// 65,507 bytes).
pub(super) const MAX_DATAGRAM_BYTES: usize = 64 * 1024;

/// Largest DNS message read over UDP: 4 KiB (EDNS sizes are rarely above).
pub(super) const MAX_DNS_UDP_BYTES: usize = 4096;

/// The explicit proxy's port on 127.0.0.1 inside the sandbox (CONNECT and absolute-form HTTP):
/// the core's, since the local provider points the sandbox's environment at it.
pub(super) use tether_relay_core::egress::explicit_proxy::EXPLICIT_PROXY_PORT;

/// Largest hosts(5) file `tether serve --egress-hosts` reads: 1 MiB.
pub(super) const MAX_HOSTS_FILE_BYTES: u64 = 1 << 20;
