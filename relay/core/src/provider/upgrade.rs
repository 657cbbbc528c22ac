//! An agent's WebSocket as the relay holds it: the connection after the upgrade's `101` (a
//! Unix socket, a TCP connection, or a provider edge's stream) and whatever the agent sent
//! after the `101`. A tunnel copies these bytes to its client without reading them (see
//! `server::splice`), or reads them as WebSocket messages ([`AgentSocket::into_websocket`])
//! where it must.
//!
//! [`upgrade`] makes one over any connected stream: it sends the upgrade with the agent's
//! credentials and checks the answer as RFC 6455 asks of a client: `101`, the accept of its
//! key, and neither an extension nor a subprotocol, which the relay offers none of and could
//! not pass through to a client that did not ask for them.

use std::any::Any;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpStream, UnixStream};
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::WebSocketStream;

use super::AgentIo;

/// Largest WebSocket message accepted from an agent when the relay reads its messages: the
/// agent's own limit, twice the largest protocol frame.
const MAX_MESSAGE: usize =
    2 * (tether_proto::limits::MAX_PAYLOAD + tether_proto::limits::HEADER_LEN);
/// Read buffer of the agent's WebSocket when the relay reads its messages: 32 KiB, as the
/// client's (the library's 128 KiB is zeroed on the first read and stays resident).
const READ_BUFFER: usize = 32 << 10;
/// The most of a refusal's body kept for its message: 64 KiB.
const MAX_REFUSAL_BODY: usize = 64 << 10;
/// How long a refusal's body may take to arrive once its head has.
const REFUSAL_BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// The connection under an agent's WebSocket.
pub enum AgentConn {
    /// A Unix socket (local sandboxes): the relay may `splice(2)` it.
    Unix(UnixStream),
    /// A TCP connection (Docker containers): the relay may `splice(2)` it.
    Tcp(TcpStream),
    /// Anything else (TLS to a provider's edge, an HTTP client's upgraded stream).
    Other(Pin<Box<dyn AgentIo>>),
}

impl AgentConn {
    /// `io` as the most specific connection it is.
    pub fn of<T: AgentIo>(io: T) -> AgentConn {
        let mut slot = Some(io);
        let any: &mut dyn Any = &mut slot;
        if let Some(unix) = any.downcast_mut::<Option<UnixStream>>() {
            return AgentConn::Unix(unix.take().expect("the slot was just filled"));
        }
        if let Some(tcp) = any.downcast_mut::<Option<TcpStream>>() {
            return AgentConn::Tcp(tcp.take().expect("the slot was just filled"));
        }
        AgentConn::Other(Box::pin(slot.take().expect("the slot was just filled")))
    }

    /// The connection as a byte stream of unknown kind.
    pub fn boxed(self) -> Pin<Box<dyn AgentIo>> {
        match self {
            AgentConn::Unix(unix) => Box::pin(unix),
            AgentConn::Tcp(tcp) => Box::pin(tcp),
            AgentConn::Other(io) => io,
        }
    }
}

/// An upgraded, authenticated connection to a sandbox's agent: the bytes on it are
/// WebSocket frames, the relay's masked as a client's are.
pub struct AgentSocket {
    conn: AgentConn,
    /// Bytes the agent sent after its `101`, read along with it: its first frames.
    early: Bytes,
}

impl AgentSocket {
    /// The WebSocket on `io`, which is past the `101`; `early` are bytes already read of it.
    pub fn new<T: AgentIo>(io: T, early: Bytes) -> AgentSocket {
        AgentSocket {
            conn: AgentConn::of(io),
            early,
        }
    }

    /// The connection, and the bytes already read of it that come first.
    pub fn into_parts(self) -> (AgentConn, Bytes) {
        (self.conn, self.early)
    }

    /// The connection read and written as WebSocket messages, the relay as the client.
    pub async fn into_websocket(self) -> WebSocketStream<Pin<Box<dyn AgentIo>>> {
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE))
            .read_buffer_size(READ_BUFFER);
        WebSocketStream::from_partially_read(
            self.conn.boxed(),
            self.early.to_vec(),
            Role::Client,
            Some(config),
        )
        .await
    }
}

/// Why an upgrade failed.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The agent (or an edge before it) answered with another status than `101`.
    #[error("HTTP {status}: {body}")]
    Refused {
        /// The status.
        status: u16,
        /// The body, as text (what a refusal says).
        body: String,
        /// Its `Location`, for redirects.
        location: Option<String>,
    },
    /// The `101` is not a valid answer to the upgrade.
    #[error("{0}")]
    Invalid(String),
    /// The connection failed during the upgrade.
    #[error("{0}")]
    Broken(String),
}

/// A WebSocket key, as the client of an upgrade sends it.
pub fn new_key() -> String {
    generate_key()
}

/// Adds the headers of a WebSocket upgrade with `key` to `headers`.
pub fn upgrade_headers(headers: &mut HeaderMap, key: &str) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(
        header::SEC_WEBSOCKET_VERSION,
        HeaderValue::from_static("13"),
    );
    headers.insert(
        header::SEC_WEBSOCKET_KEY,
        HeaderValue::from_str(key).expect("base64 is a valid header value"),
    );
}

/// Checks a `101` answer's headers against the upgrade's `key`.
pub fn check_accept(headers: &HeaderMap, key: &str) -> Result<(), UpgradeError> {
    let accept = headers
        .get(header::SEC_WEBSOCKET_ACCEPT)
        .and_then(|a| a.to_str().ok());
    if accept != Some(derive_accept_key(key.as_bytes()).as_str()) {
        return Err(UpgradeError::Invalid(
            "the WebSocket upgrade was answered without the right Sec-WebSocket-Accept".into(),
        ));
    }
    let upgrade = headers.get(header::UPGRADE).and_then(|u| u.to_str().ok());
    if !upgrade.is_some_and(|u| u.trim().eq_ignore_ascii_case("websocket")) {
        return Err(UpgradeError::Invalid(
            "the WebSocket upgrade was answered with another protocol than websocket".into(),
        ));
    }
    // Neither was offered: RFC 6455 §4.1 has a client fail a connection that gets either.
    for (name, what) in [
        (header::SEC_WEBSOCKET_EXTENSIONS, "an extension"),
        (header::SEC_WEBSOCKET_PROTOCOL, "a subprotocol"),
    ] {
        if headers.contains_key(&name) {
            return Err(UpgradeError::Invalid(format!(
                "the WebSocket upgrade was answered with {what} the relay did not offer ({name})"
            )));
        }
    }
    Ok(())
}

/// Upgrades `io` (connected to the agent, or to an edge before it) to the agent's WebSocket
/// at `url` (`ws://host/path`), sending `headers` (the agent's credentials, an edge's
/// routing).
pub async fn upgrade<T: AgentIo>(
    io: T,
    url: &str,
    mut headers: HeaderMap,
) -> Result<AgentSocket, UpgradeError> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| UpgradeError::Invalid(format!("{url} is not a URL: {e}")))?;
    let (Some(host), Some(path)) = (uri.authority(), uri.path_and_query()) else {
        return Err(UpgradeError::Invalid(format!("{url} names no host")));
    };
    let key = new_key();
    upgrade_headers(&mut headers, &key);
    let mut request = Request::get(path.as_str())
        .header(header::HOST, host.as_str())
        .body(Empty::<Bytes>::new())
        .map_err(|e| UpgradeError::Invalid(format!("cannot build the upgrade request: {e}")))?;
    request.headers_mut().extend(headers);

    let broken = |e: hyper::Error| UpgradeError::Broken(e.to_string());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(broken)?;
    // The connection is driven until the upgrade takes it over (or the answer refuses).
    let driving = tokio::spawn(conn.with_upgrades());
    let mut response = sender.send_request(request).await.map_err(broken)?;
    let status = response.status();
    if status != StatusCode::SWITCHING_PROTOCOLS {
        let location = response
            .headers()
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .map(str::to_string);
        let body = Limited::new(response.into_body(), MAX_REFUSAL_BODY).collect();
        let body = match tokio::time::timeout(REFUSAL_BODY_TIMEOUT, body).await {
            Ok(Ok(body)) => String::from_utf8_lossy(&body.to_bytes()).trim().to_string(),
            _ => String::new(),
        };
        driving.abort();
        return Err(UpgradeError::Refused {
            status: status.as_u16(),
            body,
            location,
        });
    }
    check_accept(response.headers(), &key)?;
    let upgraded = hyper::upgrade::on(&mut response).await.map_err(broken)?;
    match upgraded.downcast::<TokioIo<T>>() {
        Ok(parts) => Ok(AgentSocket::new(parts.io.into_inner(), parts.read_buf)),
        // Not the type it was given: keep hyper's wrapper, which replays what it read ahead.
        Err(upgraded) => Ok(AgentSocket::new(TokioIo::new(upgraded), Bytes::new())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves one upgrade on `server`: reads the request head, answers `answer` (with the
    /// accept of the request's key in place of `{accept}`), then `after`.
    async fn answer(mut server: UnixStream, answer: &str, after: &[u8]) -> String {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            if server.read(&mut byte).await.unwrap() == 0 {
                break;
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).unwrap();
        let key = head
            .lines()
            .find_map(|l| l.strip_prefix("sec-websocket-key: "))
            .unwrap_or_default();
        let answer = answer.replace("{accept}", &derive_accept_key(key.as_bytes()));
        server.write_all(answer.as_bytes()).await.unwrap();
        server.write_all(after).await.unwrap();
        // Held open until the client is done with it.
        let mut rest = Vec::new();
        let _ = server.read_to_end(&mut rest).await;
        head
    }

    fn bearer() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer agent-token"),
        );
        headers
    }

    #[tokio::test]
    async fn a_good_answer_gives_the_raw_socket_and_the_bytes_read_past_it() {
        let (client, server) = UnixStream::pair().unwrap();
        let ok = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                  Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n";
        let agent = tokio::spawn(answer(server, ok, b"\x82\x01x"));
        let socket = upgrade(client, "ws://sandbox/v1/agent", bearer())
            .await
            .unwrap();
        let (conn, early) = socket.into_parts();
        assert!(matches!(conn, AgentConn::Unix(_)));
        // The agent's first frame may have come with the head, or may still be in the socket.
        let mut got = early.to_vec();
        let AgentConn::Unix(mut unix) = conn else {
            unreachable!()
        };
        while got.len() < 3 {
            let mut more = [0u8; 8];
            let n = unix.read(&mut more).await.unwrap();
            got.extend_from_slice(&more[..n]);
        }
        assert_eq!(got, b"\x82\x01x");
        drop(unix);
        let head = agent.await.unwrap();
        assert!(head.starts_with("GET /v1/agent HTTP/1.1\r\n"), "{head}");
        assert!(head.contains("authorization: Bearer agent-token"), "{head}");
        assert!(head.contains("host: sandbox"), "{head}");
    }

    #[tokio::test]
    async fn wrong_accepts_extensions_subprotocols_and_refusals_are_errors() {
        let cases = [
            (
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: \
                 Upgrade\r\nSec-WebSocket-Accept: bm90IHRoZSBhY2NlcHQ=\r\n\r\n",
                "Sec-WebSocket-Accept",
            ),
            (
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: \
                 Upgrade\r\nSec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Extensions: \
                 permessage-deflate\r\n\r\n",
                "an extension",
            ),
            (
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: \
                 Upgrade\r\nSec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: \
                 chat\r\n\r\n",
                "a subprotocol",
            ),
            (
                "HTTP/1.1 401 Unauthorized\r\nContent-Length: 19\r\n\r\nwrong sandbox token",
                "HTTP 401: wrong sandbox token",
            ),
        ];
        for (reply, expected) in cases {
            let (client, server) = UnixStream::pair().unwrap();
            let agent = tokio::spawn(answer(server, reply, b""));
            let err = upgrade(client, "ws://sandbox/v1/agent", bearer())
                .await
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains(expected), "{reply:?}: {err}");
            agent.abort();
        }
    }
}
