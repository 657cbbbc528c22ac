//! The HTTP exchange of one intercepted connection: HTTP/1.1 or HTTP/2 served to the sandbox,
//! each request (its head rewritten by [`super::rewrite`]) sent to the upstream over HTTP/1.1
//! on a kept-alive TLS connection (one per concurrent request, see [`super::pool`]), each
//! response streamed back. What fails upstream is answered with a 502 whose body says what
//! failed.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_TYPE, UPGRADE};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{self, ClientConfig};
use tokio_rustls::TlsConnector;
use tracing::debug;

use super::idle::Idle;
use super::pool::{Leased, Pool};
use super::rewrite::{self, Refusal, Secrets};
use super::upgrade;
use super::{
    H2_PING_INTERVAL, MAX_HEADERS, MAX_REQUEST_HEAD, MAX_RESPONSE_HEAD, MAX_STREAMS,
    REQUEST_HEAD_TIMEOUT, RESPONSE_HEAD_TIMEOUT, UPSTREAM_CONNECT_TIMEOUT,
};

type BoxError = Box<dyn StdError + Send + Sync>;
/// What goes back to the sandbox: the upstream's body, or the injector's own answer.
type ResponseBody = BoxBody<Bytes, BoxError>;
/// What goes to the upstream: the sandbox's body, untouched.
type RequestBody = Idle<Incoming>;

/// Headers that belong to one hop (RFC 9110 §7.6.1), not forwarded either way; each side's
/// framing is hyper's. `Expect` is answered here (hyper sends the 100 Continue).
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
    "proxy-authenticate",
];

/// Where the requests of one connection go.
pub(super) struct Upstream {
    /// The name the connection was allowed for: the SNI and the name the certificate must prove.
    pub(super) host: String,
    /// The port the sandbox connected to.
    pub(super) port: u16,
    /// The addresses the egress proxy resolved `host` to, tried in order.
    pub(super) addrs: Vec<SocketAddr>,
    /// Whom to trust, speaking HTTP/1.1 by ALPN.
    pub(super) tls: Arc<ClientConfig>,
}

/// What the sandbox chose to speak, by ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Protocol {
    Http1,
    Http2,
}

/// Serves the sandbox's (decrypted) connection until it closes.
pub(super) async fn serve<IO>(
    io: IO,
    protocol: Protocol,
    upstream: Upstream,
    secrets: Secrets,
) -> Result<(), hyper::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let exchange = Arc::new(Exchange {
        upstream,
        secrets,
        pool: Arc::new(Pool::new()),
        tunnel: std::sync::Mutex::new(None),
    });
    let serving = exchange.clone();
    let service = service_fn(move |request| {
        let exchange = serving.clone();
        async move { Ok::<_, Infallible>(exchange.handle(request).await) }
    });
    let io = TokioIo::new(io);
    let served = match protocol {
        Protocol::Http1 => {
            hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(REQUEST_HEAD_TIMEOUT)
                .max_header_size(MAX_REQUEST_HEAD)
                .max_headers(MAX_HEADERS)
                .keep_alive(true)
                .serve_connection(io, service)
                .with_upgrades()
                .await
        }
        Protocol::Http2 => {
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_header_list_size(MAX_REQUEST_HEAD as u32)
                .max_concurrent_streams(MAX_STREAMS)
                .keep_alive_interval(H2_PING_INTERVAL)
                .serve_connection(io, service)
                .await
        }
    };
    // An upgraded connection lives on in its tunnel: done means done with that too.
    let tunnel = exchange.tunnel.lock().map(|mut t| t.take()).ok().flatten();
    if let Some(tunnel) = tunnel {
        let _ = tunnel.await;
    }
    served
}

/// One connection's state: where its requests go, what is replaced in them, the upstream
/// connections they use.
struct Exchange {
    upstream: Upstream,
    secrets: Secrets,
    pool: Arc<Pool<RequestBody>>,
    /// The byte tunnel of an upgraded connection (the last request on it).
    tunnel: std::sync::Mutex<Option<JoinHandle<()>>>,
}

/// Why a request did not get the upstream's response; the sentence is the 502's body.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("no address is known for {host}")]
    NoAddress { host: String },
    #[error("{host} is not a name a TLS server can be asked for")]
    NotAName { host: String },
    #[error("cannot connect to {host}:{port} at {addr}: {source}")]
    Connect {
        host: String,
        port: u16,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("connecting to {host}:{port} at {addr} took over {timeout:?}")]
    ConnectTimeout {
        host: String,
        port: u16,
        addr: SocketAddr,
        timeout: Duration,
    },
    #[error(
        "the certificate of {host}:{port} cannot be verified ({reason}); the egress proxy does \
         not send secrets to a server that cannot prove it is {host} (an operator whose upstream \
         uses a private CA gives it to `tether serve --egress-ca-file`)"
    )]
    Certificate {
        host: String,
        port: u16,
        reason: String,
    },
    #[error("the TLS handshake with {host}:{port} failed: {source}")]
    Tls {
        host: String,
        port: u16,
        source: std::io::Error,
    },
    #[error("the HTTP exchange with {host}:{port} failed: {source}")]
    Exchange {
        host: String,
        port: u16,
        source: hyper::Error,
    },
    #[error("{host}:{port} closed two connections in a row before the request could be sent")]
    Closed { host: String, port: u16 },
    #[error("{host}:{port} did not start its response within {timeout:?}")]
    ResponseTimeout {
        host: String,
        port: u16,
        timeout: Duration,
    },
}

impl Exchange {
    async fn handle(&self, mut request: Request<Incoming>) -> Response<ResponseBody> {
        let upgrade = upgrade::requested(request.headers())
            .map(|protocol| (protocol, hyper::upgrade::on(&mut request)));
        let (mut parts, body) = request.into_parts();
        let host = &self.upstream.host;
        if let Err(refusal) = rewrite::direct(&mut parts, host, self.upstream.port) {
            debug!(
                "egress: refused a request on a connection to {host}: {}",
                refusal.message
            );
            return answer(refusal);
        }
        let method = parts.method.clone();
        let used = match self.secrets.apply(&mut parts) {
            Ok(used) => used,
            Err(refusal) => {
                debug!("egress: refused a request to {host}: {}", refusal.message);
                return answer(refusal);
            }
        };
        if !used.is_empty() {
            debug!("egress: {method} to {host} carries {}", used.join(", "));
        }
        strip_hop_by_hop(&mut parts.headers);
        if let Some((protocol, _)) = &upgrade {
            upgrade::restore(&mut parts.headers, protocol.clone());
        }
        parts.version = Version::HTTP_11;
        let request = Request::from_parts(parts, Idle::new(body));

        match self.send(request).await {
            Ok((mut response, sender)) => {
                let switched = response.status() == StatusCode::SWITCHING_PROTOCOLS;
                let protocol = response.headers().get(UPGRADE).cloned();
                let upgraded = match (switched, upgrade, protocol) {
                    (false, _, _) => None,
                    (true, Some((_, client)), Some(protocol)) => {
                        let upstream = hyper::upgrade::on(&mut response);
                        Some((protocol, client, upstream))
                    }
                    (true, _, _) => {
                        return answer(Refusal {
                            status: StatusCode::BAD_GATEWAY,
                            message: format!(
                                "{host} switched protocols without an upgrade being asked for \
                                 (or without naming the protocol)"
                            ),
                        })
                    }
                };
                let (mut parts, body) = response.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                let echoed = self.secrets.scrub(&mut parts.headers);
                if !echoed.is_empty() {
                    debug!(
                        "egress: the response from {host} repeated {} in its headers: put \
                         back the placeholder",
                        echoed.join(", ")
                    );
                }
                parts.version = Version::HTTP_11;
                if let Some((protocol, client, upstream)) = upgraded {
                    debug!("egress: {method} to {host} upgraded the connection");
                    upgrade::restore(&mut parts.headers, protocol);
                    let tunnel = upgrade::tunnel(client, upstream, host.clone());
                    if let Ok(mut slot) = self.tunnel.lock() {
                        *slot = Some(tunnel);
                    }
                    return Response::from_parts(parts, Idle::new(body).boxed());
                }
                let body = Leased::new(Idle::new(body), sender, self.pool.clone());
                Response::from_parts(parts, body.boxed())
            }
            Err(failure) => {
                debug!("egress: {method} to {host} failed: {failure}");
                answer(Refusal {
                    status: StatusCode::BAD_GATEWAY,
                    message: failure.to_string(),
                })
            }
        }
    }

    /// Sends on an idle upstream connection, or a new one; a request that a closing connection
    /// gave back unsent goes once more, on a new connection. The connection comes back with
    /// the response, for its body to return to the pool.
    async fn send(
        &self,
        mut request: Request<RequestBody>,
    ) -> Result<(Response<Incoming>, SendRequest<RequestBody>), Failure> {
        let up = &self.upstream;
        for attempt in 0..2 {
            let mut sender = match self.pool.take() {
                Some(sender) => sender,
                None => self.connect().await?,
            };
            // An idle connection is ready at once, or about to be (its last response has
            // just been read to its end); one that does not become ready is given up.
            match tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, sender.ready()).await {
                Ok(Ok(())) => {}
                _ => continue,
            }
            let sent =
                tokio::time::timeout(RESPONSE_HEAD_TIMEOUT, sender.try_send_request(request));
            match sent.await {
                Ok(Ok(response)) => return Ok((response, sender)),
                Ok(Err(mut error)) => match error.take_message() {
                    Some(unsent) if attempt == 0 => request = unsent,
                    _ => {
                        return Err(Failure::Exchange {
                            host: up.host.clone(),
                            port: up.port,
                            source: error.into_error(),
                        })
                    }
                },
                // Dropping the request's future closed that connection.
                Err(_) => {
                    return Err(Failure::ResponseTimeout {
                        host: up.host.clone(),
                        port: up.port,
                        timeout: RESPONSE_HEAD_TIMEOUT,
                    })
                }
            }
        }
        Err(Failure::Closed {
            host: up.host.clone(),
            port: up.port,
        })
    }

    /// Opens a TLS connection to the first upstream address that answers, verifying that its
    /// certificate proves the host's name.
    async fn connect(&self) -> Result<SendRequest<RequestBody>, Failure> {
        let up = &self.upstream;
        let name = ServerName::try_from(up.host.clone()).map_err(|_| Failure::NotAName {
            host: up.host.clone(),
        })?;
        let mut failure = Failure::NoAddress {
            host: up.host.clone(),
        };
        for &addr in &up.addrs {
            let tcp = match tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(addr))
                .await
            {
                Ok(Ok(tcp)) => tcp,
                Ok(Err(source)) => {
                    failure = Failure::Connect {
                        host: up.host.clone(),
                        port: up.port,
                        addr,
                        source,
                    };
                    continue;
                }
                Err(_) => {
                    failure = Failure::ConnectTimeout {
                        host: up.host.clone(),
                        port: up.port,
                        addr,
                        timeout: UPSTREAM_CONNECT_TIMEOUT,
                    };
                    continue;
                }
            };
            // Requests are written whole by hyper; small ones should not wait for an ACK.
            let _ = tcp.set_nodelay(true);
            let connector = TlsConnector::from(up.tls.clone());
            let handshake = tokio::time::timeout(
                UPSTREAM_CONNECT_TIMEOUT,
                connector.connect(name.clone(), tcp),
            );
            // The same name at another address would present the same certificate: a TLS
            // failure is final.
            let tls = match handshake.await {
                Ok(Ok(tls)) => tls,
                Ok(Err(source)) => return Err(tls_failure(up, source)),
                Err(_) => {
                    return Err(Failure::ConnectTimeout {
                        host: up.host.clone(),
                        port: up.port,
                        addr,
                        timeout: UPSTREAM_CONNECT_TIMEOUT,
                    })
                }
            };
            let (sender, connection) = hyper::client::conn::http1::Builder::new()
                .max_header_size(MAX_RESPONSE_HEAD)
                .max_headers(MAX_HEADERS)
                .handshake(TokioIo::new(tls))
                .await
                .map_err(|source| Failure::Exchange {
                    host: up.host.clone(),
                    port: up.port,
                    source,
                })?;
            let host = up.host.clone();
            // Ends when the upstream closes, or once the sender is dropped and the last
            // response body is done.
            tokio::spawn(async move {
                if let Err(e) = connection.with_upgrades().await {
                    debug!("egress: the connection to {host} ended: {e}");
                }
            });
            return Ok(sender);
        }
        Err(failure)
    }
}

/// A handshake failure, told apart: a certificate that does not prove the name is the
/// operator's or an attacker's business, anything else is the network's.
fn tls_failure(up: &Upstream, source: std::io::Error) -> Failure {
    let rustls_error = source
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match rustls_error {
        Some(e @ rustls::Error::InvalidCertificate(_)) => Failure::Certificate {
            host: up.host.clone(),
            port: up.port,
            reason: e.to_string(),
        },
        _ => Failure::Tls {
            host: up.host.clone(),
            port: up.port,
            source,
        },
    }
}

/// The injector's own answer: the status, and the sentence as plain text.
fn answer(refusal: Refusal) -> Response<ResponseBody> {
    let body = format!("tether egress proxy: {}\n", refusal.message);
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = refusal.status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Removes the hop-by-hop headers, and those the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}
