//! The relay's data path between the real binaries: a spliced session is the agent's own,
//! frame for frame (the agent, not the relay, judges what the client sends), a stalled
//! reader holds up only its own stream, and the relay holds no more memory for it.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tether_client::ProcessEvent;
use tether_e2e::Relay;
use tether_proto::op::ExecSpec;
use tether_proto::{frame, Control, Frame, PROTOCOL_VERSION};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// How long one step may take on a loaded machine.
const STEP: Duration = Duration::from_secs(60);

/// A session to sandbox `id` through `relay`, past `welcome`; `announce` sends the header
/// by which a client says it pings when asked.
async fn session(relay: &Relay, id: &str, announce: bool) -> Ws {
    let url = format!(
        "{}/v1/sandboxes/{id}/ws",
        relay.url.replacen("http", "ws", 1)
    );
    let mut req = url.into_client_request().unwrap();
    let headers = req.headers_mut();
    let bearer = format!("Bearer {}", relay.admin_token);
    headers.insert("authorization", bearer.parse().unwrap());
    if announce {
        headers.insert("x-tether-ping-interval", "10000".parse().unwrap());
    }
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    let hello = Control::Hello {
        protocol: PROTOCOL_VERSION,
        token: None,
        client: "e2e/1".into(),
    };
    ws.send(Message::Binary(frame::encode_control(&hello)))
        .await
        .unwrap();
    loop {
        match ws.next().await {
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

/// Writes `raw` under the WebSocket and returns the close code and reason that come back.
async fn close_after(ws: &mut Ws, raw: &[u8]) -> (u16, String) {
    let MaybeTlsStream::Plain(tcp) = ws.get_mut() else {
        panic!("a plain connection")
    };
    tcp.write_all(raw).await.unwrap();
    loop {
        let next = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("a close");
        match next {
            Some(Ok(Message::Close(Some(frame)))) => {
                return (u16::from(frame.code), frame.reason.to_string())
            }
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    }
}

/// A masked client frame with a reserved opcode (3), which no WebSocket may send.
const RESERVED_OPCODE: [u8; 7] = [0x83, 0x81, 0, 0, 0, 0, b'x'];

#[tokio::test]
async fn through_a_splicing_relay_the_agent_itself_judges_what_the_client_sends() {
    let relay = Relay::start();
    let id = relay.create(&[]);
    // Spliced: the frame reaches the agent unread, and the agent closes with 1002 and no
    // reason (the agent's own close).
    let mut ws = session(&relay, &id, true).await;
    assert_eq!(
        close_after(&mut ws, &RESERVED_OPCODE).await,
        (1002, String::new())
    );
}

#[tokio::test]
async fn a_relay_that_must_forward_messages_judges_them_itself() {
    // An unannounced client with a peer timeout too short for the agent's pings is
    // forwarded message by message: the relay reads the frame and closes with its reason.
    let relay = Relay::start_with(&["--peer-timeout", "10s"]);
    let id = relay.create(&[]);
    let mut ws = session(&relay, &id, false).await;
    assert_eq!(
        close_after(&mut ws, &RESERVED_OPCODE).await,
        (1002, "WebSocket protocol violation".to_string())
    );
}

/// The relay's resident memory, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[tokio::test]
async fn through_the_relay_a_stalled_reader_holds_up_only_its_stream_and_no_relay_memory() {
    let relay = Relay::start();
    let id = relay.create(&[]);
    let session = relay.client().connect(&id).await.unwrap();
    let before = rss(relay.pid());
    // A gigabyte nobody reads: its credit runs out and `head` blocks.
    let stalled = session
        .exec(ExecSpec::argv(["head", "-c", "1073741824", "/dev/zero"]))
        .await
        .unwrap();
    let mut flowing = session
        .exec(ExecSpec::argv(["head", "-c", "268435456", "/dev/zero"]))
        .await
        .unwrap();
    let mut received = 0u64;
    let mut peak = 0u64;
    tokio::time::timeout(STEP, async {
        loop {
            match flowing.next().await {
                Some(Ok(ProcessEvent::Stdout(b))) => received += b.len() as u64,
                Some(Ok(ProcessEvent::Exit(status))) => {
                    assert!(status.success());
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
            peak = peak.max(rss(relay.pid()));
        }
    })
    .await
    .expect("the flowing stream finishes");
    assert_eq!(received, 268_435_456);
    // The relay copies without holding a stream's bytes: it grew by no more than its
    // pipes and buffers, whatever the stalled stream has in flight.
    assert!(
        peak < before + (16 << 20),
        "the relay grew from {} to {} MiB",
        before >> 20,
        peak >> 20
    );
    let listed = session.processes().await.unwrap();
    let stalled = listed
        .iter()
        .find(|p| p.process == stalled.process)
        .unwrap();
    assert!(
        stalled.exit.is_none() && stalled.offsets[0] < 64 << 20,
        "{stalled:?}"
    );
}
