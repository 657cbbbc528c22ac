//! Servers run inside a sandbox for the forward and preview tests (python3 from the host's
//! `/usr`, standard library only), and a raw HTTP/1.1 client to talk to them.

use std::time::{Duration, Instant};

use tether_client::Session;
use tether_proto::op::{Command, ExecSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a server may take to listen.
const READY: Duration = Duration::from_secs(30);

/// Starts `argv` in the background inside the sandbox and waits until `port` listens.
pub(crate) async fn start(s: &Session, argv: &[&str], port: u16) {
    let spec = ExecSpec {
        command: Command::Argv(argv.iter().map(|&a| a.into()).collect()),
        background: true,
        ..ExecSpec::argv(Vec::<String>::new())
    };
    let process = s.exec(spec).await.expect("start a server in the sandbox");
    drop(process);
    let deadline = Instant::now() + READY;
    loop {
        let ports = s.ports().await.expect("list ports");
        if ports.iter().any(|p| p.port == port) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{argv:?} did not listen on {port} within {READY:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `python3 -m http.server` serving `html` as `/index.html` on `port`.
pub(crate) async fn http_site(s: &Session, port: u16, html: &str) {
    let dir = format!("/workspace/site-{port}");
    s.write_file(&format!("{dir}/index.html"), html.as_bytes())
        .await
        .unwrap();
    let port_arg = port.to_string();
    let argv = [
        "python3",
        "-m",
        "http.server",
        &port_arg,
        "--bind",
        "127.0.0.1",
        "--directory",
        &dir,
    ];
    start(s, &argv, port).await;
}

/// A WebSocket echo server on `port`.
pub(crate) async fn ws_echo(s: &Session, port: u16) {
    script(
        s,
        "ws_echo.py",
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/ws_echo.py")),
        port,
    )
    .await;
}

/// A server that reads to the end, then answers `got N bytes`, on `port`.
pub(crate) async fn count_then_reply(s: &Session, port: u16) {
    script(
        s,
        "count_then_reply.py",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/count_then_reply.py"
        )),
        port,
    )
    .await;
}

async fn script(s: &Session, name: &str, source: &str, port: u16) {
    let path = format!("/workspace/{name}");
    s.write_file(&path, source.as_bytes()).await.unwrap();
    start(s, &["python3", &path, &port.to_string()], port).await;
}

/// An HTTP response, as read off the wire.
#[derive(Debug)]
pub(crate) struct Response {
    /// The status code.
    pub status: u16,
    /// The header block, lowercase.
    pub head: String,
    /// The body.
    pub body: String,
}

/// `GET path` from `addr` with this `Host` and extra header lines; the connection is closed
/// after the response.
pub(crate) async fn get(addr: &str, host: &str, path: &str, extra: &[(&str, &str)]) -> Response {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (name, value) in extra {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Response {
        status,
        head: head.to_lowercase(),
        body: body.to_string(),
    }
}
