//! `tether forward`: local ports carried to servers inside a sandbox — HTTP with many
//! concurrent connections, a WebSocket, and a half-closed connection.

use crate::servers;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use futures_util::{SinkExt, StreamExt};
use tether_e2e::Relay;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

/// A running `tether forward`, stopped on drop.
struct Forward {
    child: Child,
    /// The local address of each forward, in argument order.
    addrs: Vec<String>,
}

impl Forward {
    fn start(relay: &Relay, id: &str, ports: &[&str]) -> Forward {
        let mut child = relay
            .tether()
            .arg("forward")
            .arg(id)
            .args(ports)
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("start tether forward");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut addrs = Vec::new();
        while addrs.len() < ports.len() {
            let line = lines.next().expect("a forwarding line").unwrap();
            // forwarding 127.0.0.1:PORT -> ID:REMOTE
            let addr = line
                .strip_prefix("forwarding ")
                .and_then(|r| r.split(' ').next());
            addrs.push(
                addr.unwrap_or_else(|| panic!("unexpected line: {line}"))
                    .to_string(),
            );
        }
        Forward { child, addrs }
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn http_through_a_forward_with_many_connections_at_once() {
    let relay = Relay::start();
    let client = relay.client();
    let id = client.create(&Default::default()).await.unwrap().id;
    let s = client.connect(&id).await.unwrap();
    servers::http_site(&s, 8000, "<h1>forwarded page</h1>").await;
    let fwd = Forward::start(&relay, &id, &["0:8000"]);
    let addr = fwd.addrs[0].clone();

    let requests = (0..32).map(|_| {
        let addr = addr.clone();
        tokio::spawn(async move { servers::get(&addr, "localhost", "/index.html", &[]).await })
    });
    for r in futures_util::future::join_all(requests).await {
        let r = r.unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.body, "<h1>forwarded page</h1>");
    }
}

#[tokio::test]
async fn websockets_pass_through_a_forward() {
    let relay = Relay::start();
    let client = relay.client();
    let id = client.create(&Default::default()).await.unwrap().id;
    let s = client.connect(&id).await.unwrap();
    servers::ws_echo(&s, 9001).await;
    let fwd = Forward::start(&relay, &id, &["0:9001"]);

    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/echo", fwd.addrs[0]))
        .await
        .expect("WebSocket handshake through the forward");
    ws.send(Message::Text("hello sandbox".into()))
        .await
        .unwrap();
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    ws.send(Message::Binary(big.clone().into())).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::Text("hello sandbox".into())
    );
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::Binary(big.into())
    );
    ws.close(None).await.unwrap();
}

#[tokio::test]
async fn a_half_close_reaches_the_server_and_its_answer_comes_back() {
    let relay = Relay::start();
    let client = relay.client();
    let id = client.create(&Default::default()).await.unwrap().id;
    let s = client.connect(&id).await.unwrap();
    servers::count_then_reply(&s, 9002).await;
    let fwd = Forward::start(&relay, &id, &["0:9002"]);

    let mut tcp = tokio::net::TcpStream::connect(&fwd.addrs[0]).await.unwrap();
    let payload = vec![7u8; 1 << 20];
    tcp.write_all(&payload).await.unwrap();
    tcp.shutdown().await.unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.unwrap();
    assert_eq!(answer, "got 1048576 bytes");
}
