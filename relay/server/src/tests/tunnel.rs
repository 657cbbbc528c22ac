//! The data path: bytes through unchanged both ways (spliced, and forwarded as messages where
//! the relay must ping), closes passed on, silent sides dropped, errors before the upgrade.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::{eventually, TestRelay, AGENT_CLOSE_COMMAND};

/// The peer timeout of relays that must forward messages: below the splicing minimum, so a
/// client that does not announce its pings is forwarded.
const FORWARDING_TIMEOUT: Duration = Duration::from_secs(20);
/// The peer timeout of relays that splice even a client that does not announce its pings.
const SPLICING_TIMEOUT: Duration = Duration::from_secs(30);
/// A peer timeout short enough for silence tests.
const SHORT_TIMEOUT: Duration = Duration::from_millis(600);

/// The next message that is not a ping or pong.
async fn next_data<S>(ws: &mut S) -> Option<Message>
where
    S: futures_util::Stream<Item = Result<Message, WsError>> + Unpin,
{
    loop {
        match ws.next().await? {
            Ok(Message::Ping(_) | Message::Pong(_)) => continue,
            Ok(msg) => return Some(msg),
            Err(_) => return None,
        }
    }
}

fn http_status(err: &WsError) -> u16 {
    match err {
        WsError::Http(resp) => resp.status().as_u16(),
        other => panic!("expected an HTTP refusal, got {other}"),
    }
}

/// Messages of every size, a burst, a ping, and a close, through a tunnel of `t`.
async fn round_trips(t: &TestRelay) {
    let admin = t.admin();
    let sb = t.create(&admin, json!({"provider": "fake"})).await;
    let mut ws = t.tunnel(&sb.id, &admin).await.unwrap();

    // Sizes around the edges: empty, tiny, a protocol-sized chunk, over a MiB.
    let sizes = [0usize, 1, 6, 65_536, (1 << 20) + 6];
    let payloads: Vec<Bytes> = sizes
        .iter()
        .map(|&n| {
            (0..n)
                .map(|i| (i * 31 % 251) as u8)
                .collect::<Vec<u8>>()
                .into()
        })
        .collect();
    for p in &payloads {
        ws.send(Message::Binary(p.clone())).await.unwrap();
        assert_eq!(next_data(&mut ws).await, Some(Message::Binary(p.clone())));
    }

    // A burst, sent without waiting, comes back complete and in order.
    let burst: Vec<Bytes> = (0..2000u32)
        .map(|i| Bytes::from(i.to_be_bytes().to_vec()))
        .collect();
    for m in &burst {
        ws.feed(Message::Binary(m.clone())).await.unwrap();
    }
    ws.flush().await.unwrap();
    for m in &burst {
        assert_eq!(next_data(&mut ws).await, Some(Message::Binary(m.clone())));
    }

    // A ping is answered (by the agent through a splice, by the relay when forwarding).
    ws.send(Message::Ping(Bytes::from_static(b"p")))
        .await
        .unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::Pong(Bytes::from_static(b"p"))
    );

    // The client closes: the close goes through and the handshake completes.
    ws.close(None).await.unwrap();
    assert!(matches!(next_data(&mut ws).await, Some(Message::Close(_))));
    // The tunnel's end counts as activity, and it no longer holds the sandbox open.
    let relay = t.relay.as_ref().unwrap().relay.clone();
    eventually("the tunnel to close", || async {
        !relay.tunnels.is_active(&sb.id.clone().into())
    })
    .await;
}

#[tokio::test]
async fn carries_messages_both_ways_unchanged_spliced_and_forwarded() {
    round_trips(&TestRelay::start().await).await;
    round_trips(&TestRelay::start_with_peer_timeout(FORWARDING_TIMEOUT).await).await;
}

#[tokio::test]
async fn each_client_gets_its_own_agent_connection_and_agent_closes_pass_on() {
    let t = TestRelay::start().await;
    let admin = t.admin();
    let sb = t.create(&admin, json!({"provider": "fake"})).await;
    let mut a = t.tunnel(&sb.id, &admin).await.unwrap();
    let mut b = t.tunnel(&sb.id, &admin).await.unwrap();
    assert_eq!(t.provider.connects.load(Ordering::SeqCst), 2);
    a.send(Message::Binary(Bytes::from_static(b"to a")))
        .await
        .unwrap();
    b.send(Message::Binary(Bytes::from_static(b"to b")))
        .await
        .unwrap();
    assert_eq!(
        next_data(&mut b).await,
        Some(Message::Binary(Bytes::from_static(b"to b")))
    );
    assert_eq!(
        next_data(&mut a).await,
        Some(Message::Binary(Bytes::from_static(b"to a")))
    );

    // The agent closes a's connection: a sees the agent's own close; b is untouched.
    a.send(Message::Binary(Bytes::from_static(AGENT_CLOSE_COMMAND)))
        .await
        .unwrap();
    match next_data(&mut a).await {
        Some(Message::Close(Some(frame))) => {
            assert_eq!(
                (u16::from(frame.code), frame.reason.as_str()),
                (1000, "bye")
            );
        }
        other => panic!("expected the agent's close, got {other:?}"),
    }
    b.send(Message::Text("still here".into())).await.unwrap();
    assert_eq!(
        next_data(&mut b).await,
        Some(Message::Text("still here".into()))
    );
}

#[tokio::test]
async fn refuses_before_the_upgrade_when_the_agent_cannot_be_reached() {
    let t = TestRelay::start().await;
    let admin = t.admin();
    assert_eq!(
        http_status(&t.tunnel("sb-nope", &admin).await.unwrap_err()),
        404
    );
    let sb = t.create(&admin, json!({"provider": "fake"})).await;
    assert_eq!(
        http_status(&t.tunnel(&sb.id, "tether_wrong").await.unwrap_err()),
        401
    );

    t.provider.refuse_connect.store(true, Ordering::SeqCst);
    let refused = t.tunnel(&sb.id, &admin).await.unwrap_err();
    assert_eq!(http_status(&refused), 502);
    if let WsError::Http(resp) = &refused {
        let body = String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).into_owned();
        assert!(
            body.contains("cannot reach the agent") && body.contains("provider_error"),
            "{body}"
        );
    }
    t.provider.refuse_connect.store(false, Ordering::SeqCst);

    // The provider lost it: 404, and the relay forgets it.
    t.provider.lose(&sb.id);
    assert_eq!(
        http_status(&t.tunnel(&sb.id, &admin).await.unwrap_err()),
        404
    );
    let path = format!("/v1/sandboxes/{}", sb.id);
    eventually("the gone sandbox to be forgotten", || async {
        t.call("GET", &path, &admin, None).await.0 == 410
    })
    .await;
}

#[tokio::test]
async fn shutdown_ends_open_tunnels_spliced_and_forwarded() {
    for (peer_timeout, spliced) in [(SPLICING_TIMEOUT, true), (FORWARDING_TIMEOUT, false)] {
        let mut t = TestRelay::start_with_peer_timeout(peer_timeout).await;
        let admin = t.admin();
        let sb = t.create(&admin, json!({"provider": "fake"})).await;
        let mut ws = t.tunnel(&sb.id, &admin).await.unwrap();
        ws.send(Message::Binary(Bytes::from_static(b"x")))
            .await
            .unwrap();
        assert!(next_data(&mut ws).await.is_some());

        let relay = t.relay.take().unwrap();
        tokio::time::timeout(Duration::from_secs(5), relay.shutdown())
            .await
            .expect("shutdown finishes promptly with a tunnel open");
        // Forwarding, the relay says why; splicing, it cannot say anything mid-stream.
        match next_data(&mut ws).await {
            Some(Message::Close(Some(frame))) if !spliced => {
                assert_eq!(u16::from(frame.code), 1001)
            }
            None if spliced => {}
            other => panic!("expected the end of the tunnel, got {other:?}"),
        }
    }
}

/// The close code the relay sends after `raw` bytes are written under a forwarded tunnel's
/// WebSocket.
async fn close_code_after(t: &TestRelay, raw: &[u8]) -> u16 {
    use tokio_tungstenite::MaybeTlsStream;
    let admin = t.admin();
    let sb = t.create(&admin, json!({"provider": "fake"})).await;
    let mut ws = t.tunnel(&sb.id, &admin).await.unwrap();
    let MaybeTlsStream::Plain(tcp) = ws.get_mut() else {
        panic!("a plain connection")
    };
    tcp.write_all(raw).await.unwrap();
    match next_data(&mut ws).await {
        Some(Message::Close(Some(frame))) => u16::from(frame.code),
        other => panic!("expected a close frame, got {other:?}"),
    }
}

/// A masked client frame: `first` (FIN, RSV, opcode), the length, a zero mask, `payload`.
fn masked_frame(first: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mut frame = vec![first, 0x80 | payload.len() as u8, 0, 0, 0, 0];
    frame.extend_from_slice(payload);
    frame
}

#[tokio::test]
async fn a_forwarded_client_breaking_the_websocket_protocol_gets_rfc_6455_close_codes() {
    let t = TestRelay::start_with_peer_timeout(FORWARDING_TIMEOUT).await;
    // A reserved bit set without an extension that defines it: a protocol violation.
    assert_eq!(close_code_after(&t, &masked_frame(0xC2, b"x")).await, 1002);
    // A text message that is not UTF-8: invalid payload data.
    assert_eq!(
        close_code_after(&t, &masked_frame(0x81, &[0xff, 0xfe])).await,
        1007
    );

    // A message over the relay's limit: too big.
    let admin = t.admin();
    let sb = t.create(&admin, json!({"provider": "fake"})).await;
    let mut ws = t.tunnel(&sb.id, &admin).await.unwrap();
    let huge = vec![7u8; crate::constants::MAX_MESSAGE + 1];
    // The relay may close before the whole message is written.
    let _ = ws.send(Message::Binary(huge.into())).await;
    match next_data(&mut ws).await {
        Some(Message::Close(Some(frame))) => assert_eq!(u16::from(frame.code), 1009),
        other => panic!("expected a close frame, got {other:?}"),
    }
}

/// An agent the test plays byte by byte: each connection's upgrade is answered with
/// `answer` (`{accept}` standing for the accept of the request's key), then the connection
/// and the request head are handed to the test.
struct RawAgent {
    accepted: mpsc::UnboundedReceiver<(TcpStream, String)>,
}

/// The `101` a well-behaved agent answers with.
const GOOD_ANSWER: &str = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                           Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n";

impl RawAgent {
    async fn start(t: &TestRelay, answer: &'static str) -> RawAgent {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        *t.provider.agent_override.lock().unwrap() = Some(addr);
        let (tx, accepted) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let head = read_head(&mut tcp).await;
                let key = header_of(&head, "sec-websocket-key").unwrap_or_default();
                let reply = answer.replace("{accept}", &derive_accept_key(key.as_bytes()));
                tcp.write_all(reply.as_bytes()).await.unwrap();
                let _ = tx.send((tcp, head));
            }
        });
        RawAgent { accepted }
    }

    async fn next(&mut self) -> (TcpStream, String) {
        tokio::time::timeout(Duration::from_secs(10), self.accepted.recv())
            .await
            .expect("the relay connects to the agent")
            .unwrap()
    }
}

/// Reads an HTTP head byte by byte, so nothing after it is consumed.
async fn read_head(tcp: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(
            tcp.read(&mut byte).await.unwrap(),
            1,
            "the head ended early"
        );
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

/// The value of header `name` (lowercase) in `head`.
fn header_of(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// A client the test plays byte by byte: opens a tunnel to `id` with `extra` headers and,
/// in the same write, `early` bytes; returns the connection and the relay's answer's head.
async fn raw_client(t: &TestRelay, id: &str, extra: &str, early: &[u8]) -> (TcpStream, String) {
    let addr = t.relay.as_ref().unwrap().addr;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let key = "dGhlIHNhbXBsZSBub25jZQ==";
    let mut request = format!(
        "GET /v1/sandboxes/{id}/ws HTTP/1.1\r\nHost: relay\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\
         Authorization: Bearer {}\r\n{extra}\r\n",
        t.admin()
    )
    .into_bytes();
    request.extend_from_slice(early);
    tcp.write_all(&request).await.unwrap();
    let head = read_head(&mut tcp).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert_eq!(
        header_of(&head, "sec-websocket-accept").as_deref(),
        Some(derive_accept_key(key.as_bytes()).as_str()),
        "{head}"
    );
    assert!(
        header_of(&head, "sec-websocket-extensions").is_none(),
        "{head}"
    );
    (tcp, head)
}

/// Reads exactly `n` bytes.
async fn read_n(tcp: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut got = vec![0u8; n];
    tokio::time::timeout(Duration::from_secs(10), tcp.read_exact(&mut got))
        .await
        .expect("the bytes arrive")
        .unwrap();
    got
}

/// Whether `tcp` ends (EOF or reset) within `limit`, reading and dropping whatever comes.
async fn ends_within(tcp: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn a_spliced_tunnel_passes_bytes_it_could_not_decode_unchanged() {
    let t = TestRelay::start().await;
    let mut agent = RawAgent::start(&t, GOOD_ANSWER).await;
    let sb = t.create(&t.admin(), json!({"provider": "fake"})).await;
    // Frames no WebSocket may send, let alone a Tether client: a reserved opcode with every
    // reserved bit set, a text message that is not UTF-8, and a message larger than the
    // relay would ever accept when reading frames. The first comes in the same write as the
    // upgrade, before the relay has answered it.
    let reserved = masked_frame(0xF3, b"no such opcode");
    let (mut client, _) = raw_client(&t, &sb.id, "", &reserved).await;
    let (mut agent_side, head) = agent.next().await;
    let not_utf8 = masked_frame(0x81, &[0xff, 0xfe, 0xfd]);
    let huge_len = crate::constants::MAX_MESSAGE + 1;
    let mut huge = vec![0x82, 0xFF];
    huge.extend_from_slice(&(huge_len as u64).to_be_bytes());
    huge.extend_from_slice(&[1, 2, 3, 4]);
    huge.extend((0..huge_len).map(|i| (i % 253) as u8));
    client.write_all(&not_utf8).await.unwrap();
    client.write_all(&huge).await.unwrap();
    let mut sent = reserved.clone();
    sent.extend_from_slice(&not_utf8);
    sent.extend_from_slice(&huge);
    assert_eq!(read_n(&mut agent_side, sent.len()).await, sent);

    // The agent's side goes back as unread: a reserved control opcode, unmasked.
    let back = [0x8B, 0x03, b'a', b'b', b'c'];
    agent_side.write_all(&back).await.unwrap();
    assert_eq!(read_n(&mut client, back.len()).await, back);

    // The agent was asked with its own token, and never saw the client's.
    let token = header_of(&head, "authorization").unwrap();
    assert!(t
        .provider
        .agent_tokens()
        .iter()
        .any(|a| token == format!("Bearer {a}")));
    assert!(!head.contains(&t.admin()), "{head}");

    // The client hangs up: the agent's connection ends too.
    drop(client);
    assert!(ends_within(&mut agent_side, Duration::from_secs(5)).await);
}

#[tokio::test]
async fn the_101_asks_for_pings_at_a_third_of_the_peer_timeout() {
    let t = TestRelay::start_with_peer_timeout(Duration::from_secs(3)).await;
    let _agent = RawAgent::start(&t, GOOD_ANSWER).await;
    let sb = t.create(&t.admin(), json!({"provider": "fake"})).await;
    let (_client, head) = raw_client(&t, &sb.id, "X-Tether-Ping-Interval: 10000\r\n", b"").await;
    assert_eq!(
        header_of(&head, "x-tether-ping-interval").as_deref(),
        Some("1000")
    );
}

/// A masked ping frame.
fn ping() -> Vec<u8> {
    masked_frame(0x89, b"")
}

#[tokio::test]
async fn a_spliced_tunnel_drops_a_silent_agent_and_a_silent_client() {
    let t = TestRelay::start_with_peer_timeout(SHORT_TIMEOUT).await;
    let mut agent = RawAgent::start(&t, GOOD_ANSWER).await;
    let sb = t.create(&t.admin(), json!({"provider": "fake"})).await;
    let announce = "X-Tether-Ping-Interval: 200\r\n";
    let relay = t.relay.as_ref().unwrap().relay.clone();
    let open = || relay.tunnels.is_active(&sb.id.clone().into());

    // Both sides speak every 100 ms: the session outlives many timeouts.
    let (mut client, _) = raw_client(&t, &sb.id, announce, b"").await;
    let (mut agent_side, _) = agent.next().await;
    for _ in 0..(SHORT_TIMEOUT * 4).as_millis() / 100 {
        client.write_all(&ping()).await.unwrap();
        agent_side.write_all(&[0x8A, 0x00]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(open(), "a live session was dropped");
    // The agent goes silent while the client keeps pinging: both connections end.
    let pinging = tokio::spawn(async move {
        loop {
            if client.write_all(&ping()).await.is_err() {
                return client;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert!(ends_within(&mut agent_side, SHORT_TIMEOUT * 5).await);
    let mut client = tokio::time::timeout(Duration::from_secs(5), pinging)
        .await
        .expect("the client's connection ends")
        .unwrap();
    assert!(ends_within(&mut client, Duration::from_secs(1)).await);

    // The client goes silent while the agent keeps pinging.
    let (mut client, _) = raw_client(&t, &sb.id, announce, b"").await;
    let (mut agent_side, _) = agent.next().await;
    let started = tokio::time::Instant::now();
    let pinging = tokio::spawn(async move {
        loop {
            if agent_side.write_all(&[0x89, 0x00]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert!(ends_within(&mut client, SHORT_TIMEOUT * 5).await);
    assert!(
        started.elapsed() >= SHORT_TIMEOUT / 2,
        "{:?}",
        started.elapsed()
    );
    tokio::time::timeout(Duration::from_secs(5), pinging)
        .await
        .expect("the agent's connection ends")
        .unwrap();
    eventually("the tunnels to close", || async { !open() }).await;
}

#[tokio::test]
async fn an_agent_answering_with_what_the_relay_did_not_offer_is_refused_before_the_upgrade() {
    let t = TestRelay::start().await;
    let _agent = RawAgent::start(
        &t,
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n",
    )
    .await;
    let admin = t.admin();
    let sb = t.create(&admin, json!({"provider": "fake"})).await;
    let refused = t.tunnel(&sb.id, &admin).await.unwrap_err();
    assert_eq!(http_status(&refused), 502);
    if let WsError::Http(resp) = &refused {
        let body = String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).into_owned();
        assert!(body.contains("an extension"), "{body}");
    }
}

#[tokio::test]
async fn an_unannounced_client_is_forwarded_below_the_splicing_minimum_and_spliced_above() {
    for (peer_timeout, spliced) in [(FORWARDING_TIMEOUT, false), (SPLICING_TIMEOUT, true)] {
        let t = TestRelay::start_with_peer_timeout(peer_timeout).await;
        let mut agent = RawAgent::start(&t, GOOD_ANSWER).await;
        let sb = t.create(&t.admin(), json!({"provider": "fake"})).await;
        let (mut client, _) = raw_client(&t, &sb.id, "", b"").await;
        let (mut agent_side, _) = agent.next().await;
        // A ping from the client: forwarded, the relay answers it; spliced, the agent gets it.
        client.write_all(&ping()).await.unwrap();
        if spliced {
            assert_eq!(read_n(&mut agent_side, 6).await, ping());
        } else {
            assert_eq!(read_n(&mut client, 2).await, [0x8A, 0x00]);
        }
    }
}

#[tokio::test]
async fn bytes_stranded_by_a_failed_tunnel_never_reach_another() {
    let t = TestRelay::start().await;
    let mut agent = RawAgent::start(&t, GOOD_ANSWER).await;
    let sb = t.create(&t.admin(), json!({"provider": "fake"})).await;
    for round in 0..5 {
        // A client uploads while its agent reads a little and hangs up with the rest unread
        // (a reset): the relay's pipe for that direction is left holding bytes.
        let (mut client, _) = raw_client(&t, &sb.id, "", b"").await;
        let (mut agent_side, _) = agent.next().await;
        let upload = tokio::spawn(async move {
            let chunk = vec![0xA5u8; 1 << 20];
            for _ in 0..16 {
                if client.write_all(&chunk).await.is_err() {
                    break;
                }
            }
            client
        });
        let mut some = [0u8; 4096];
        let _ = agent_side.read(&mut some).await.unwrap();
        drop(agent_side);
        drop(upload.await.unwrap());

        // The next tunnel carries its own bytes only.
        let (mut client, _) = raw_client(&t, &sb.id, "", b"").await;
        let (mut agent_side, _) = agent.next().await;
        let fresh = [0x82, 0x05, b'f', b'r', b'e', b's', b'h'];
        agent_side.write_all(&fresh).await.unwrap();
        assert_eq!(
            read_n(&mut client, fresh.len()).await,
            fresh,
            "round {round}"
        );
    }
}
