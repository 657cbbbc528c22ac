//! The egress proxy of one sandbox: for a local sandbox, the transparent listener (where the
//! rules send TCP to fake addresses and allowed networks; the original destination comes from
//! `SO_ORIGINAL_DST`) and the explicit one on 127.0.0.1:3128 (CONNECT and absolute-form HTTP);
//! for a sandbox elsewhere, the requests [`super::remote`] authenticated as the sandbox's.
//! All apply the same policy: a fake address stands for the allowed name it was given to; a
//! TLS server name and an HTTP `Host` must be allowed too; an address outside a fake one must
//! be in an allowed network. Every address, literal or resolved, then passes [`super::reach`]
//! (never the relay's own host). The proxy resolves names itself and connects from the host;
//! bytes then move through [`super::tunnel`]. Every refusal is logged with the sandbox, what
//! and why.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;

use nix::sys::socket::{getsockopt, sockopt};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::constants::{
    CONNECT_TIMEOUT, FIRST_BYTES_WAIT, HEAD_TIMEOUT, MAX_HEAD_BYTES, TUNNEL_IDLE_TIMEOUT,
};
use super::inject::Injector;
use super::policy::Allowlist;
use super::pool::{FakePool, FAKE_NETWORK};
use super::preset;
use super::reach::{self, Reach, Refused};
use super::resolve::Resolver;
use super::sniff::{self, Head, Opening};
use super::stream::Peeked;
use super::tunnel;

/// A connection the proxy serves: TCP from a local sandbox's namespace, or TLS or TCP from a
/// sandbox elsewhere.
pub(super) trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// One sandbox's proxy.
pub(super) struct Proxy {
    /// The sandbox, for the log.
    pub(super) id: String,
    /// What it may reach.
    pub(super) allowlist: Arc<Allowlist>,
    /// Its fake addresses (local sandboxes, whose DNS the relay answers).
    pub(super) pool: Option<Arc<FakePool>>,
    /// How names become addresses.
    pub(super) resolver: Arc<Resolver>,
    /// Which addresses it may reach at all ([`reach::shared`]).
    pub(super) reach: &'static Reach,
    /// TLS interception for hosts that carry its secrets, if it has any.
    pub(super) injector: Option<Arc<Injector>>,
    /// Its connection slots (`MAX_CONNECTIONS`), shared by all its listeners.
    pub(super) slots: Arc<Semaphore>,
    /// Whether its allowed networks are reached from the relay's host. Not for a sandbox
    /// elsewhere: its `--allow-cidr` networks are its provider's, which it reaches directly
    /// (they are in its `NO_PROXY`), never the relay host's.
    pub(super) networks_here: bool,
}

/// Where a connection is going.
enum Dest {
    /// An allowed name, on a port.
    Name(String, u16),
    /// An address in an allowed network.
    Addr(SocketAddr),
}

impl Proxy {
    /// Serves `listener` until `stop`: transparent if `transparent`, else the explicit proxy.
    pub(super) async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        transparent: bool,
        stop: CancellationToken,
    ) {
        loop {
            let permit = tokio::select! {
                _ = stop.cancelled() => return,
                p = self.slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            };
            let accepted = tokio::select! {
                _ = stop.cancelled() => return,
                a = listener.accept() => a,
            };
            let Ok((conn, _)) = accepted else { continue };
            let _ = conn.set_nodelay(true);
            let (proxy, stop) = (self.clone(), stop.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = proxy.handle(conn, transparent, permit) => {}
                }
            });
        }
    }

    async fn handle(&self, conn: TcpStream, transparent: bool, _permit: OwnedSemaphorePermit) {
        if transparent {
            self.transparent(conn).await
        } else {
            let mut conn = Peeked::new(conn);
            match read_head(&mut conn).await {
                Ok(head) => self.request(conn, head).await,
                Err(why) => {
                    let _ = respond(&mut conn, 400, &[], &format!("{why}\n")).await;
                }
            }
        }
    }

    fn refuse(&self, what: &str, why: &str) {
        tracing::info!(sandbox = %self.id, what, why, "egress refused");
    }

    /// A connection the rules redirected here.
    async fn transparent(&self, conn: TcpStream) {
        let Some(dst) = original_destination(&conn) else {
            return self.refuse("a connection", "its original destination is unknown");
        };
        let ip = *dst.ip();
        let dest = if FAKE_NETWORK.contains(&ip) {
            match self.pool.as_ref().and_then(|pool| pool.name_of(ip)) {
                Some(name) => Dest::Name(name, dst.port()),
                None => {
                    return self.refuse(&dst.to_string(), "no DNS answer gave out this address")
                }
            }
        } else if self.allowlist.allows_addr(IpAddr::V4(ip)) {
            if let Err(why) = self.reachable(IpAddr::V4(ip), false) {
                return self.refuse(&dst.to_string(), &why.to_string());
            }
            Dest::Addr(SocketAddr::V4(dst))
        } else {
            return self.refuse(&dst.to_string(), "the address is in no allowed network");
        };
        self.forward(Peeked::new(conn), dest).await
    }

    /// One request to the explicit proxy, whose `head` has been read ahead on `conn`: a
    /// CONNECT, or an absolute-form request.
    pub(super) async fn request<S: Io>(&self, mut conn: Peeked<S>, head: Head) {
        let connect = head.method.eq_ignore_ascii_case("CONNECT");
        let authority = if connect {
            Some(head.target.as_str())
        } else {
            head.target
                .strip_prefix("http://")
                .map(|rest| rest.split(['/', '?']).next().unwrap_or(rest))
        };
        let Some((host, port)) = authority.and_then(sniff::split_authority) else {
            let _ = respond(
                &mut conn,
                400,
                &[],
                "this is the sandbox's HTTP proxy: send `CONNECT host:port` or an absolute-form \
                 request such as `GET http://host/path`\n",
            )
            .await;
            return;
        };
        let port = match (port, connect) {
            (Some(p), _) => p,
            (None, false) => 80,
            (None, true) => {
                let _ = respond(
                    &mut conn,
                    400,
                    &[],
                    "CONNECT needs a port: `CONNECT host:443`\n",
                )
                .await;
                return;
            }
        };
        let dest = match self.dest_of_authority(&host, port) {
            Ok(dest) => dest,
            Err(denial) => {
                let _ = denial.send(&mut conn).await;
                return;
            }
        };
        // The head is dropped only now: the proxy answered it, or rewrites it below.
        conn.consume(head.len);
        if connect {
            if conn
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .is_err()
            {
                return;
            }
            return self.forward(conn, dest).await;
        }
        let mut upstream = match self.connect(&dest).await {
            Ok(upstream) => upstream,
            Err(why) => {
                let _ = respond(&mut conn, 502, &[], &format!("tether egress: {why}\n")).await;
                return;
            }
        };
        let rewritten = origin_form(&head, &host, port);
        if upstream.write_all(&rewritten).await.is_ok() {
            self.tunnel(&mut conn, &mut upstream).await;
        }
    }

    /// Where `host:port` of a CONNECT or an absolute URL leads, or the refusal saying why not.
    fn dest_of_authority(&self, host: &str, port: u16) -> Result<Dest, Denial> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            if !self.networks_here {
                self.refuse(
                    host,
                    "an address, through the relay, for a sandbox elsewhere",
                );
                return Err(Denial::new(
                    format!("{host} is an address, which goes direct, not through the relay"),
                    format!(
                        "tether egress: {host} is an address, and the relay's proxy takes only \
                         host names from sandbox {}: its allowed networks are reached directly \
                         from where it runs (NO_PROXY lists them), never from the relay's \
                         network.\n",
                        self.id
                    ),
                ));
            }
            let ip = reach::canonical(ip);
            if self.allowlist.allows_addr(ip) {
                if let Err(why) = self.reachable(ip, false) {
                    self.refuse(host, &why.to_string());
                    return Err(Denial::new(
                        format!("{host} may not be reached: {why}"),
                        format!(
                            "tether egress: sandbox {}'s egress policy refused this request: \
                             {host} may not be reached: {why}.\n",
                            self.id
                        ),
                    ));
                }
                return Ok(Dest::Addr(SocketAddr::new(ip, port)));
            }
            self.refuse(host, "the address is in no allowed network");
            return Err(Denial::new(
                format!(
                    "{host} is in no network on its allowlist (allow it with --allow-cidr \
                     {host}/32)"
                ),
                format!(
                    "tether egress: sandbox {}'s egress policy refused this request: {host} is \
                     in no network on its allowlist. To reach it, create the sandbox with \
                     --allow-cidr {host}/32 (or a network containing it).\n",
                    self.id
                ),
            ));
        }
        if self.allowlist.allows_host(host) {
            return Ok(Dest::Name(host.to_string(), port));
        }
        self.refuse(host, "the name is not on the allowlist");
        Err(self.denied_host(host))
    }

    /// The refusal of a name off the allowlist, naming the flag (and the preset, if one holds
    /// the name) that would allow it.
    fn denied_host(&self, host: &str) -> Denial {
        let how = match preset::holding(host).next() {
            Some(p) => format!("--allow-host {host} or the preset {}", p.reference()),
            None => format!("--allow-host {host}"),
        };
        Denial::new(
            format!("{host} is not on its allowlist (allow it with {how})"),
            format!(
                "tether egress: sandbox {id}'s egress policy refused this request: {host} is not \
                 on its allowlist. To reach it, create the sandbox with {how} (or a wildcard \
                 such as *.example.com above it); `tether info {id}` shows what it may reach.\n",
                id = self.id
            ),
        )
    }

    /// Checks what the client sends first against the policy, then passes the connection on.
    async fn forward<S: Io>(&self, mut conn: Peeked<S>, dest: Dest) {
        if let Dest::Name(name, port) = &dest {
            let wait = if matches!(port, 80 | 443) {
                HEAD_TIMEOUT
            } else {
                FIRST_BYTES_WAIT
            };
            match peek_opening(&mut conn, wait).await {
                Opening::Tls(Some(sni)) if !self.allowlist.allows_host(&sni) => {
                    return self.refuse(
                        &sni,
                        &format!("TLS server name not on the allowlist (connection to {name})"),
                    );
                }
                Opening::Tls(_) => {
                    if let Some(injector) = self.injector.as_ref().filter(|i| i.intercepts(name)) {
                        let addrs = match self.addresses(name, *port).await {
                            Ok(addrs) => addrs,
                            Err(why) => return self.refuse(name, &why),
                        };
                        if let Err(e) = injector.serve(conn, name, *port, &addrs).await {
                            tracing::info!(sandbox = %self.id, host = %name, "egress: {e}");
                        }
                        return;
                    }
                }
                Opening::Http(head) => {
                    let host = head.host.as_deref().and_then(sniff::split_authority);
                    if let Some((host, _)) = host.filter(|(h, _)| !self.allowlist.allows_host(h)) {
                        self.refuse(&host, "HTTP Host not on the allowlist");
                        let _ = self.denied_host(&host).send(&mut conn).await;
                        return;
                    }
                }
                Opening::Incomplete | Opening::Other => {}
            }
        }
        let Ok(mut upstream) = self.connect(&dest).await else {
            return;
        };
        self.tunnel(&mut conn, &mut upstream).await;
    }

    /// Moves bytes until both sides are done, or nothing moves for [`TUNNEL_IDLE_TIMEOUT`].
    async fn tunnel<S: Io>(&self, conn: &mut Peeked<S>, upstream: &mut TcpStream) {
        if let Err(e) = tunnel::copy(conn, upstream, TUNNEL_IDLE_TIMEOUT).await {
            tracing::debug!(sandbox = %self.id, "egress: a proxied connection ended: {e}");
        }
    }

    /// Whether the filter lets this sandbox reach `addr` (`trusted`: from the hosts file).
    fn reachable(&self, addr: IpAddr, trusted: bool) -> Result<(), Refused> {
        self.reach.check(addr, &self.allowlist.networks, trusted)
    }

    /// The addresses of `name` this sandbox may reach, at this moment (a name that rebinds to
    /// the relay's host is caught here, at every connection); or why there is none.
    async fn addresses(&self, name: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        let found = self.resolver.resolve(name, port).await.map_err(|e| {
            tracing::info!(sandbox = %self.id, host = %name, "egress: cannot resolve: {e}");
            format!("{name} does not resolve: {e}")
        })?;
        let mut refused = None;
        let addrs: Vec<SocketAddr> = found
            .addrs
            .into_iter()
            .filter(|a| match self.reachable(a.ip(), found.from_hosts_file) {
                Ok(()) => true,
                Err(why) => {
                    refused.get_or_insert(why);
                    false
                }
            })
            .collect();
        match (addrs.is_empty(), refused) {
            (false, _) => Ok(addrs),
            (true, Some(why)) => {
                self.refuse(name, &why.to_string());
                Err(format!("{name} leads only where no sandbox may go: {why}"))
            }
            (true, None) => Err(format!("{name} has no address")),
        }
    }

    /// Connects to `dest` from the host; on failure, what failed (logged, and the body of a
    /// 502 where the client speaks HTTP to the proxy).
    async fn connect(&self, dest: &Dest) -> Result<TcpStream, String> {
        let (what, addrs) = match dest {
            Dest::Addr(addr) => (addr.to_string(), vec![*addr]),
            Dest::Name(name, port) => {
                let what = format!("{name}:{port}");
                match self.addresses(name, *port).await {
                    Ok(addrs) => (what, addrs),
                    Err(why) => return Err(format!("cannot connect to {what}: {why}")),
                }
            }
        };
        let mut last = String::from("the name has no address the proxy may use");
        for addr in addrs {
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
                Ok(Ok(up)) => {
                    let _ = up.set_nodelay(true);
                    return Ok(up);
                }
                Ok(Err(e)) => last = format!("{addr}: {e}"),
                Err(_) => last = format!("{addr}: no answer within {CONNECT_TIMEOUT:?}"),
            }
        }
        tracing::info!(sandbox = %self.id, dest = %what, "egress: cannot connect: {last}");
        Err(format!("cannot connect to {what}: {last}"))
    }
}

/// Where a redirected connection was going (IPv4: the rules redirect only IPv4).
fn original_destination(conn: &TcpStream) -> Option<SocketAddrV4> {
    let sin = getsockopt(conn, sockopt::OriginalDst).ok()?;
    Some(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        u16::from_be(sin.sin_port),
    ))
}

/// What the client sends first, waiting up to `wait` for its first bytes and `HEAD_TIMEOUT`
/// for the rest of its first message. What is read stays ahead on `conn`, to be forwarded.
async fn peek_opening<S: Io>(conn: &mut Peeked<S>, wait: std::time::Duration) -> Opening {
    if conn.ahead().is_empty() {
        match tokio::time::timeout(wait, conn.fill(MAX_HEAD_BYTES)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Opening::Other,
        }
    }
    let deadline = tokio::time::Instant::now() + HEAD_TIMEOUT;
    loop {
        match sniff::opening(conn.ahead()) {
            // A first message split over several segments: read on until it is whole.
            Opening::Incomplete if conn.ahead().len() < MAX_HEAD_BYTES => {
                match tokio::time::timeout_at(deadline, conn.fill(MAX_HEAD_BYTES)).await {
                    Ok(Ok(n)) if n > 0 => {}
                    _ => return Opening::Other,
                }
            }
            Opening::Incomplete => return Opening::Other,
            found => return found,
        }
    }
}

/// Reads the request head at the start of `conn` ahead (it stays there, unconsumed), within
/// `HEAD_TIMEOUT`; or why there is none, as a sentence for a 400.
pub(super) async fn read_head<S: Io>(conn: &mut Peeked<S>) -> Result<Head, String> {
    let deadline = tokio::time::Instant::now() + HEAD_TIMEOUT;
    loop {
        if !conn.ahead().is_empty() {
            match sniff::head(conn.ahead()) {
                Ok(Some(head)) => return Ok(head),
                Ok(None) if conn.ahead().len() < MAX_HEAD_BYTES => {}
                Ok(None) => {
                    return Err(format!(
                        "the request head is larger than {MAX_HEAD_BYTES} bytes"
                    ))
                }
                Err(e) => return Err(format!("not an HTTP request ({e})")),
            }
        }
        match tokio::time::timeout_at(deadline, conn.fill(MAX_HEAD_BYTES)).await {
            Ok(Ok(0)) => return Err("the connection closed before a request".into()),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(format!("the connection failed: {e}")),
            Err(_) => return Err(format!("no complete request head within {HEAD_TIMEOUT:?}")),
        }
    }
}

/// The absolute-form request `head` as the origin server expects it: origin-form target, the
/// `Host` of the URL, no proxy headers, and `Connection: close` (the next request on the
/// client's connection may be for another host).
fn origin_form(head: &Head, host: &str, port: u16) -> Vec<u8> {
    let after_scheme = head.target.strip_prefix("http://").unwrap_or(&head.target);
    let path = match after_scheme.find(['/', '?']) {
        Some(i) if after_scheme[i..].starts_with('/') => after_scheme[i..].to_string(),
        Some(i) => format!("/{}", &after_scheme[i..]),
        None => "/".to_string(),
    };
    let mut out = format!("{} {path} HTTP/1.1\r\n", head.method).into_bytes();
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let authority = if port == 80 {
        host
    } else {
        format!("{host}:{port}")
    };
    out.extend_from_slice(format!("Host: {authority}\r\n").as_bytes());
    for (name, value) in &head.headers {
        let skip = [
            "host",
            "connection",
            "proxy-connection",
            "proxy-authorization",
            "keep-alive",
        ];
        if skip.iter().any(|s| name.eq_ignore_ascii_case(s)) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// What starts the reason phrase of every refusal by a sandbox's allowlist.
const DENIED_PHRASE: &str = "Forbidden by the sandbox's egress policy";

/// A refusal by the sandbox's allowlist: a 403 whose reason phrase says so and why, because a
/// client that fails on a proxy's answer prints its status line (pip: `Tunnel connection
/// failed: 403 Forbidden by the sandbox's egress policy: ...`; curl: `CONNECT tunnel failed,
/// response 403`), and whose body says it again with what to do, for those that show a body.
struct Denial {
    /// After [`DENIED_PHRASE`] and `: `; one line of printable ASCII.
    why: String,
    /// The body, ending in a newline.
    body: String,
}

impl Denial {
    fn new(why: String, body: String) -> Self {
        // A reason phrase is one line of text (RFC 9112); the host in it came from the client.
        let why = why
            .chars()
            .map(|c| {
                if c == ' ' || c.is_ascii_graphic() {
                    c
                } else {
                    '?'
                }
            })
            .collect();
        Self { why, body }
    }

    fn phrase(&self) -> String {
        format!("{DENIED_PHRASE}: {}", self.why)
    }

    async fn send<S: AsyncWrite + Unpin>(&self, conn: &mut S) -> std::io::Result<()> {
        respond_as(conn, 403, &self.phrase(), &[], &self.body).await
    }
}

/// Answers a short plain-text response with `headers` (name, value) besides the framing, and
/// closes.
pub(super) async fn respond<S: AsyncWrite + Unpin>(
    conn: &mut S,
    status: u16,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<()> {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        407 => "Proxy Authentication Required",
        429 => "Too Many Requests",
        503 => "Service Unavailable",
        _ => "Bad Gateway",
    };
    respond_as(conn, status, reason, headers, body).await
}

/// [`respond`] with the reason phrase `reason`.
async fn respond_as<S: AsyncWrite + Unpin>(
    conn: &mut S,
    status: u16,
    reason: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<()> {
    let mut text = format!("HTTP/1.1 {status} {reason}\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str(&format!(
        "Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    ));
    conn.write_all(text.as_bytes()).await?;
    conn.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_requests_become_origin_form_without_proxy_headers() {
        let raw = b"GET http://api.test:8080/v1?x=1 HTTP/1.1\r\nHost: evil.test\r\n\
                    Proxy-Authorization: x\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n";
        let head = sniff::head(raw).unwrap().unwrap();
        let out = String::from_utf8(origin_form(&head, "api.test", 8080)).unwrap();
        assert_eq!(
            out,
            "GET /v1?x=1 HTTP/1.1\r\nHost: api.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let head = sniff::head(b"GET http://a.test HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(String::from_utf8(origin_form(&head, "a.test", 80))
            .unwrap()
            .starts_with("GET / HTTP/1.1\r\nHost: a.test\r\n"));
    }

    #[tokio::test]
    async fn a_refusal_says_it_is_the_policy_in_its_status_line_on_one_line() {
        let denial = Denial::new("evil\r\nX-Injected: 1 \u{e9}".into(), "body\n".into());
        let mut out = Vec::new();
        denial.send(&mut out).await.unwrap();
        let out = String::from_utf8(out).unwrap();
        let (status, rest) = out.split_once("\r\n").unwrap();
        assert_eq!(
            status,
            "HTTP/1.1 403 Forbidden by the sandbox's egress policy: evil??X-Injected: 1 ?"
        );
        assert!(rest.starts_with("Content-Type: text/plain"), "{rest}");
        assert!(out.ends_with("\r\n\r\nbody\n"), "{out}");
    }
}
