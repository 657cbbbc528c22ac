//! The data path: bytes through unchanged both ways, closes passed on, errors before the
//! upgrade.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::{eventually, TestRelay, AGENT_CLOSE_COMMAND};

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

#[tokio::test]
async fn forwards_binary_messages_both_ways_unchanged() {
    let t = TestRelay::start().await;
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

    // Pings are answered by the relay; they are not forwarded.
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
        !relay.tunnels.is_open(&sb.id.clone().into())
    })
    .await;
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
async fn shutdown_closes_open_tunnels() {
    let mut t = TestRelay::start().await;
    let admin = t.admin();
    let sb = t.create(&admin, json!({"provider": "fake"})).await;
    let mut ws = t.tunnel(&sb.id, &admin).await.unwrap();
    ws.send(Message::Binary(Bytes::from_static(b"x")))
        .await
        .unwrap();
    assert!(next_data(&mut ws).await.is_some());

    let relay = t.relay.take().unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), relay.shutdown())
        .await
        .expect("shutdown finishes promptly with a tunnel open");
    match next_data(&mut ws).await {
        Some(Message::Close(Some(frame))) => assert_eq!(u16::from(frame.code), 1001),
        other => panic!("expected a going-away close, got {other:?}"),
    }
}

/// The close code the relay sends after `raw` bytes are written under a tunnel's WebSocket.
async fn close_code_after(t: &TestRelay, raw: &[u8]) -> u16 {
    use tokio::io::AsyncWriteExt;
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

/// A masked client frame header: `first` (FIN, RSV, opcode), then a mask of zeros.
fn masked_frame(first: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mut frame = vec![first, 0x80 | payload.len() as u8, 0, 0, 0, 0];
    frame.extend_from_slice(payload);
    frame
}

#[tokio::test]
async fn a_client_breaking_the_websocket_protocol_gets_rfc_6455_close_codes() {
    let t = TestRelay::start().await;
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
    let huge = vec![7u8; crate::server::constants::MAX_MESSAGE + 1];
    // The relay may close before the whole message is written.
    let _ = ws.send(Message::Binary(huge.into())).await;
    match next_data(&mut ws).await {
        Some(Message::Close(Some(frame))) => assert_eq!(u16::from(frame.code), 1009),
        other => panic!("expected a close frame, got {other:?}"),
    }
}
