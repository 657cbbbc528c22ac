//! What a client that sends too much, or too slowly, gets from the real binaries: a request
//! body declared larger than the relay takes is a 413 before any of it is read, a body that
//! stalls or trickles is cut at the body timeout, and a WebSocket message over the limit is
//! closed with 1009 (Message Too Big), heard by the client, on every endpoint that accepts
//! WebSockets: the agent itself, a relay that splices, and a relay that forwards.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tether_e2e::{Agent, Relay};
use tether_proto::{frame, Control, Frame, PROTOCOL_VERSION};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// How long one step may take on a loaded machine.
const STEP: Duration = Duration::from_secs(60);
/// The body timeout the relays here run with.
const BODY_TIMEOUT: Duration = Duration::from_secs(2);
/// What a relay's answer may take beyond what it waits for, on a loaded machine.
const SLACK: Duration = Duration::from_secs(5);
/// Oversized messages sent: half as large again as the agent's and the relay's limit (twice
/// the largest frame, about 2 MiB), as the issue found; and more than the loopback's socket
/// buffers hold, so the client is still sending when the receiver stops reading (a receiver
/// that then drops its socket resets the connection under the client's close frame).
const OVERSIZED: [usize; 2] = [3 << 20, 24 << 20]; // 3 MiB, 24 MiB

fn addr_of(relay: &Relay) -> SocketAddr {
    relay
        .url
        .trim_start_matches("http://")
        .parse()
        .expect("a plain relay's address")
}

/// Sends `head` (a request head, and the start of its body) and returns all the relay
/// answers until it closes the connection, and how long that took; fails if it is still
/// open after `wait`.
fn answer_to(addr: SocketAddr, head: &str, wait: Duration) -> (String, Duration) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(wait)).unwrap();
    let sent = Instant::now();
    tcp.write_all(head.as_bytes()).unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer)
        .expect("the relay answered and closed the connection in time");
    (
        String::from_utf8_lossy(&answer).into_owned(),
        sent.elapsed(),
    )
}

#[test]
fn a_body_declared_too_large_is_refused_before_it_is_read() {
    let relay = Relay::start_with(&["--body-timeout", "2s"]);
    // 2^40 bytes declared, two sent: answered at once, long before the body timeout.
    let head = format!(
        "POST /v1/sandboxes HTTP/1.1\r\nhost: relay\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: 1099511627776\r\n\r\n{{}}",
        relay.admin_token
    );
    let (answer, took) = answer_to(addr_of(&relay), &head, BODY_TIMEOUT + SLACK);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains("1099511627776 bytes") && answer.contains("smaller request"),
        "{answer}"
    );
    assert!(took < BODY_TIMEOUT, "the 413 took {took:?}");
    // So is one with no token: the body is refused before anything else is looked at.
    let head = "PUT /v1/secrets/x HTTP/1.1\r\nhost: relay\r\ncontent-length: 1099511627776\r\n\r\n";
    let (answer, _) = answer_to(addr_of(&relay), head, BODY_TIMEOUT + SLACK);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}

#[test]
fn a_stalled_or_trickling_body_is_cut_at_the_body_timeout() {
    let relay = Relay::start_with(&["--body-timeout", "2s"]);
    let addr = addr_of(&relay);
    // Stalled: 100 bytes declared, two sent, then nothing.
    let head = format!(
        "POST /v1/tokens HTTP/1.1\r\nhost: relay\r\nauthorization: Bearer {}\r\n\
         content-length: 100\r\n\r\n{{}}",
        relay.admin_token
    );
    let (answer, took) = answer_to(addr, &head, BODY_TIMEOUT + SLACK);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("--body-timeout"), "{answer}");
    assert!(
        took >= BODY_TIMEOUT - Duration::from_millis(100),
        "{took:?}"
    );

    // Trickling: a byte every 200 ms never finishes 100 bytes within the timeout, though
    // the body is never silent for long.
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let head = format!(
        "POST /v1/tokens HTTP/1.1\r\nhost: relay\r\nauthorization: Bearer {}\r\n\
         content-length: 100\r\n\r\n",
        relay.admin_token
    );
    tcp.write_all(head.as_bytes()).unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // Bounded: 100 bytes at most, and the loop ends when the relay closes.
    for _ in 0..100 {
        if tcp.write_all(b" ").is_err() {
            break;
        }
        match tcp.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        started.elapsed() < BODY_TIMEOUT + SLACK,
        "{:?}",
        started.elapsed()
    );

    // Meanwhile, and after, a whole body is served.
    let body = r#"{"tenant":"t-1"}"#;
    let head = format!(
        "POST /v1/tokens HTTP/1.1\r\nhost: relay\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n\
         {body}",
        relay.admin_token,
        body.len()
    );
    let (answer, _) = answer_to(addr, &head, STEP);
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
}

/// A client configured to send (and take) messages far over the agent's limit.
fn big_client() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(64 << 20))
        .max_frame_size(Some(64 << 20))
}

/// Opens a session at `url` (with `bearer`, and the header by which a client says it pings
/// when asked if `announce`) and says hello with `token`, past `welcome`.
async fn session(url: &str, bearer: &str, token: Option<&str>, announce: bool) -> Ws {
    let mut req = url.into_client_request().unwrap();
    let headers = req.headers_mut();
    headers.insert("authorization", format!("Bearer {bearer}").parse().unwrap());
    if announce {
        headers.insert("x-tether-ping-interval", "10000".parse().unwrap());
    }
    let (mut ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(big_client()), false)
        .await
        .unwrap();
    let hello = Control::Hello {
        protocol: PROTOCOL_VERSION,
        token: token.map(str::to_string),
        client: "e2e/1".into(),
    };
    ws.send(Message::Binary(frame::encode_control(&hello)))
        .await
        .unwrap();
    loop {
        match tokio::time::timeout(STEP, ws.next())
            .await
            .expect("welcome")
        {
            Some(Ok(Message::Binary(b))) => {
                assert!(matches!(
                    Frame::decode(b),
                    Ok(Frame::Control(Control::Welcome { .. }))
                ));
                return ws;
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            other => panic!("expected welcome, got {other:?}"),
        }
    }
}

/// Sends a message of `size` bytes and returns the close code that comes back; panics if
/// the connection ends without a close frame (the client would report 1006).
async fn close_code_after_oversized(ws: &mut Ws, size: usize) -> u16 {
    // The send itself may fail once the peer has closed; what the client reads is the test.
    let _ = tokio::time::timeout(STEP, ws.send(Message::Binary(vec![7u8; size].into())))
        .await
        .expect("the peer read the message (or closed) in time");
    loop {
        let next = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("a close");
        match next {
            Some(Ok(Message::Close(Some(frame)))) => return u16::from(frame.code),
            Some(Ok(Message::Binary(_) | Message::Ping(_) | Message::Pong(_))) => continue,
            other => panic!("expected a close frame, got {other:?} (1006 to the client)"),
        }
    }
}

#[tokio::test]
async fn an_oversized_message_to_the_agent_is_closed_with_1009() {
    let agent = Agent::start();
    for size in OVERSIZED {
        let mut ws = session(&agent.url, &agent.token, Some(&agent.token), false).await;
        assert_eq!(
            close_code_after_oversized(&mut ws, size).await,
            1009,
            "{size}"
        );
    }
}

#[tokio::test]
async fn an_oversized_message_through_a_splicing_relay_is_closed_with_1009() {
    let relay = Relay::start();
    let id = relay.create(&[]);
    let url = format!(
        "{}/v1/sandboxes/{id}/ws",
        relay.url.replacen("http", "ws", 1)
    );
    // Spliced: the agent judges the message, and its close reaches the client.
    for size in OVERSIZED {
        let mut ws = session(&url, &relay.admin_token, None, true).await;
        assert_eq!(
            close_code_after_oversized(&mut ws, size).await,
            1009,
            "{size}"
        );
    }
}

#[tokio::test]
async fn an_oversized_message_through_a_forwarding_relay_is_closed_with_1009() {
    // Unannounced, with a peer timeout too short for the agent's pings: the relay reads
    // messages itself, and closes with its own 1009.
    let relay = Relay::start_with(&["--peer-timeout", "10s"]);
    let id = relay.create(&[]);
    let url = format!(
        "{}/v1/sandboxes/{id}/ws",
        relay.url.replacen("http", "ws", 1)
    );
    for size in OVERSIZED {
        let mut ws = session(&url, &relay.admin_token, None, false).await;
        assert_eq!(
            close_code_after_oversized(&mut ws, size).await,
            1009,
            "{size}"
        );
    }
}
