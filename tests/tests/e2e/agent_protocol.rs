//! The agent's protocol surface: authentication, version checks, malformed input, port
//! forwarding and listening ports. Exec and files have their own test files.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use tether_client::{files, ClientError, Event, Session};
use tether_e2e::Agent;
use tether_proto::op::Op;
use tether_proto::{frame, Control, ErrorCode, Frame, StreamId, PROTOCOL_VERSION};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn raw_connect(
    agent: &Agent,
    bearer: Option<&str>,
) -> Result<Ws, tokio_tungstenite::tungstenite::Error> {
    let mut req = agent.url.as_str().into_client_request().unwrap();
    if let Some(t) = bearer {
        req.headers_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    tokio_tungstenite::connect_async(req)
        .await
        .map(|(ws, _)| ws)
}

async fn next_control(ws: &mut Ws) -> Control {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("agent answered in time")
            .expect("connection open")
            .expect("no websocket error");
        if let Message::Binary(b) = msg {
            if let Frame::Control(c) = Frame::decode(b).expect("agent frames decode") {
                return c;
            }
        }
    }
}

async fn hello(ws: &mut Ws, token: Option<&str>, protocol: u32) -> Control {
    let msg = Control::Hello {
        protocol,
        token: token.map(str::to_string),
        client: "test".into(),
    };
    ws.send(Message::Binary(frame::encode_control(&msg)))
        .await
        .unwrap();
    next_control(ws).await
}

#[tokio::test]
async fn wrong_token_at_upgrade_gets_401() {
    let agent = Agent::start();
    let err = raw_connect(&agent, Some("wrong")).await.unwrap_err();
    match err {
        tokio_tungstenite::tungstenite::Error::Http(resp) => {
            assert_eq!(resp.status().as_u16(), 401);
            let body =
                String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).to_string();
            assert!(body.contains("token"), "{body}");
        }
        other => panic!("expected HTTP 401, got {other}"),
    }
    let client_err = Session::connect(&agent.url, Some("wrong"))
        .await
        .unwrap_err();
    assert!(
        matches!(client_err, ClientError::Http { status: 401, .. }),
        "{client_err:?}"
    );
}

/// The token may come in `X-Tether-Agent-Token` instead (for edges that read `Authorization`
/// themselves): checked the same way, and `Authorization` wins when both are sent.
#[tokio::test]
async fn token_in_the_tether_header_is_checked_at_upgrade() {
    let agent = Agent::start();
    let connect = |token: String, bearer: Option<String>| {
        let mut req = agent.url.as_str().into_client_request().unwrap();
        req.headers_mut()
            .insert(tether_proto::auth::TOKEN_HEADER, token.parse().unwrap());
        if let Some(b) = bearer {
            req.headers_mut()
                .insert("authorization", format!("Bearer {b}").parse().unwrap());
        }
        async move {
            tokio_tungstenite::connect_async(req)
                .await
                .map(|(ws, _)| ws)
        }
    };
    match connect("wrong".into(), None).await.unwrap_err() {
        tokio_tungstenite::tungstenite::Error::Http(resp) => {
            assert_eq!(resp.status().as_u16(), 401)
        }
        other => panic!("expected HTTP 401, got {other}"),
    }
    match connect(agent.token.clone(), Some("wrong".into()))
        .await
        .unwrap_err()
    {
        tokio_tungstenite::tungstenite::Error::Http(resp) => {
            assert_eq!(resp.status().as_u16(), 401)
        }
        other => panic!("expected HTTP 401, got {other}"),
    }
    // Authenticated at the upgrade: a hello without a token is welcomed.
    let mut ws = connect(format!(" {} ", agent.token), None).await.unwrap();
    match hello(&mut ws, None, PROTOCOL_VERSION).await {
        Control::Welcome { .. } => {}
        other => panic!("expected welcome, got {other:?}"),
    }
}

#[tokio::test]
async fn token_in_hello_is_checked() {
    let agent = Agent::start();
    let mut ws = raw_connect(&agent, None).await.unwrap();
    match hello(&mut ws, Some("wrong"), PROTOCOL_VERSION).await {
        Control::Error { code, .. } => assert_eq!(code, ErrorCode::Unauthorized),
        other => panic!("expected unauthorized, got {other:?}"),
    }
    let mut ws = raw_connect(&agent, None).await.unwrap();
    match hello(&mut ws, None, PROTOCOL_VERSION).await {
        Control::Error { code, .. } => assert_eq!(code, ErrorCode::Unauthorized),
        other => panic!("expected unauthorized, got {other:?}"),
    }
    let mut ws = raw_connect(&agent, None).await.unwrap();
    match hello(&mut ws, Some(&agent.token), PROTOCOL_VERSION).await {
        Control::Welcome {
            protocol,
            capabilities,
            ..
        } => {
            assert_eq!(protocol, PROTOCOL_VERSION);
            assert!(capabilities.iter().any(|c| c == "exec"));
        }
        other => panic!("expected welcome, got {other:?}"),
    }
}

#[tokio::test]
async fn wrong_protocol_version_is_refused_by_name() {
    let agent = Agent::start();
    let mut ws = raw_connect(&agent, Some(&agent.token)).await.unwrap();
    match hello(&mut ws, None, 99).await {
        Control::Error { code, message, .. } => {
            assert_eq!(code, ErrorCode::Unsupported);
            assert!(message.contains("99") && message.contains('1'), "{message}");
        }
        other => panic!("expected unsupported, got {other:?}"),
    }
}

#[tokio::test]
async fn malformed_frames_get_errors_and_the_connection_keeps_serving() {
    let agent = Agent::start();
    let mut ws = raw_connect(&agent, Some(&agent.token)).await.unwrap();
    assert!(matches!(
        hello(&mut ws, None, PROTOCOL_VERSION).await,
        Control::Welcome { .. }
    ));

    let oversized = {
        let mut v = vec![0x11, 0, 0, 0, 1, 0];
        v.resize(6 + (1 << 20) + 1, 0);
        Bytes::from(v)
    };
    let bad: Vec<Message> = vec![
        Message::Binary(Bytes::from_static(&[0x11, 0, 0])), // truncated
        Message::Binary(Bytes::from_static(&[0x1f, 0, 0, 0, 1, 0, 1])), // unknown kind
        Message::Binary(Bytes::from_static(&[0x21, 0, 0, 0, 1, 1, 1])), // wrong frame version
        Message::Binary(Bytes::from_static(&[0x11, 0, 0, 0, 1, 9, 1])), // unknown channel
        Message::Binary(Bytes::from_static(&[0x13, 0, 0, 0, 0, 0, b'{'])), // bad JSON
        Message::Binary(Bytes::from_static(&[0x11, 0, 0, 0, 7, 0, 1])), // data for no stream
        Message::Binary(oversized),
        Message::Text("hello".into()),
    ];
    for msg in bad {
        ws.send(msg).await.unwrap();
        match next_control(&mut ws).await {
            Control::Error { code, .. } => assert_eq!(code, ErrorCode::InvalidArgument),
            other => panic!("expected an error, got {other:?}"),
        }
    }
    // Still serving: an info request on stream 5 gets its reply and closes.
    let open = Control::Open {
        stream: StreamId(5),
        window: None,
        op: Op::Info,
    };
    ws.send(Message::Binary(frame::encode_control(&open)))
        .await
        .unwrap();
    assert!(matches!(
        next_control(&mut ws).await,
        Control::Reply {
            stream: StreamId(5),
            ..
        }
    ));
    assert!(matches!(
        next_control(&mut ws).await,
        Control::Closed {
            stream: StreamId(5)
        }
    ));
}

#[tokio::test]
async fn reusing_an_open_stream_id_is_refused() {
    let agent = Agent::start();
    let mut ws = raw_connect(&agent, Some(&agent.token)).await.unwrap();
    assert!(matches!(
        hello(&mut ws, None, PROTOCOL_VERSION).await,
        Control::Welcome { .. }
    ));
    let dir = agent.dir.path().to_string_lossy().to_string();
    let watch = Control::Open {
        stream: StreamId(3),
        window: None,
        op: Op::Watch {
            path: dir.into(),
            recursive: true,
        },
    };
    ws.send(Message::Binary(frame::encode_control(&watch)))
        .await
        .unwrap();
    ws.send(Message::Binary(frame::encode_control(&watch)))
        .await
        .unwrap();
    // The first watch answers `ok` once it is active; the second open gets the error.
    loop {
        match next_control(&mut ws).await {
            Control::Reply { stream, .. } => assert_eq!(stream, StreamId(3)),
            Control::Error {
                stream,
                code,
                message,
            } => {
                assert_eq!(stream, Some(StreamId(3)));
                assert_eq!(code, ErrorCode::InvalidArgument);
                assert!(message.contains("already open"), "{message}");
                break;
            }
            other => panic!("expected an error, got {other:?}"),
        }
    }
}

/// A tiny HTTP server inside the "sandbox" (here: on the agent's loopback).
async fn http_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut req = Vec::new();
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = sock.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&buf[..n]);
                }
                let body = "hello from inside";
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    port
}

async fn collect(mut stream: tether_client::RawStream) -> String {
    let mut body = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev {
            Event::Data(_, b) => body.extend_from_slice(&b),
            Event::Closed => break,
            Event::Error(e) => panic!("{e}"),
            _ => {}
        }
    }
    String::from_utf8(body).unwrap()
}

#[tokio::test]
async fn forwards_to_an_http_server_and_lists_it() {
    let agent = Agent::start();
    let session = agent.session().await;
    let port = http_server().await;

    let ports = session.ports().await.unwrap();
    assert!(ports.iter().any(|p| p.port == port), "{ports:?}");

    // Several concurrent forwarded connections on one session.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let session = session.clone();
        tasks.push(tokio::spawn(async move {
            let stream = session.connect_port(port).await.unwrap();
            stream
                .send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .unwrap();
            stream.eof().await.unwrap();
            collect(stream).await
        }));
    }
    for t in tasks {
        let resp = t.await.unwrap();
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        assert!(resp.ends_with("hello from inside"), "{resp}");
    }

    // The same through a local socket, as `tether forward` does.
    let (mine, theirs) = tokio::io::duplex(1 << 16);
    let stream = session.connect_port(port).await.unwrap();
    let pump = tokio::spawn(files::splice(stream, theirs));
    let (mut rd, mut wr) = tokio::io::split(mine);
    wr.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut resp = String::new();
    rd.read_to_string(&mut resp).await.unwrap();
    assert!(resp.ends_with("hello from inside"), "{resp}");
    drop(wr);
    drop(rd);
    tokio::time::timeout(Duration::from_secs(10), pump)
        .await
        .expect("splice ends after both sides close")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn half_close_reaches_the_server_and_its_reply_still_arrives() {
    let agent = Agent::start();
    let session = agent.session().await;
    // An "upper-case echo until EOF" server: it answers only after our half-close.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut all = Vec::new();
        sock.read_to_end(&mut all).await.unwrap();
        sock.write_all(&all.to_ascii_uppercase()).await.unwrap();
    });
    let stream = session.connect_port(port).await.unwrap();
    stream.send(b"abc").await.unwrap();
    stream.eof().await.unwrap();
    assert_eq!(collect(stream).await, "ABC");
}

#[tokio::test]
async fn connecting_to_a_closed_port_says_nothing_listens() {
    let agent = Agent::start();
    let session = agent.session().await;
    // Bind then drop to find a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut stream = session.connect_port(port).await.unwrap();
    loop {
        match stream.next().await {
            Some(Event::Error(ClientError::Remote { code, message })) => {
                assert_eq!(code, ErrorCode::NotFound);
                assert!(message.contains(&port.to_string()), "{message}");
                break;
            }
            Some(Event::Closed) | None => panic!("expected an error"),
            _ => {}
        }
    }
}

#[tokio::test]
async fn info_describes_the_machine() {
    let agent = Agent::start();
    let info = agent.session().await.info().await.unwrap();
    assert_eq!(info.agent_version, tether_proto::TETHER_VERSION);
    assert!(info.cpus >= 1);
    assert!(info.memory_bytes > 0);
    assert_eq!(info.pid, agent.pid());
    assert_eq!(std::path::Path::new(&info.cwd), agent.dir.path());
}

/// A control frame carrying `json` as it is, whether or not it decodes.
fn raw_control(json: &str) -> Message {
    let mut v = vec![0x13, 0, 0, 0, 0, 0];
    v.extend_from_slice(json.as_bytes());
    Message::Binary(Bytes::from(v))
}

/// Sends an `open` and returns the code of the stream error it gets, checking `closed` follows.
async fn open_error(ws: &mut Ws, stream: u32, open: &str) -> (ErrorCode, String) {
    ws.send(raw_control(open)).await.unwrap();
    let (code, message) = match next_control(ws).await {
        Control::Error {
            stream: Some(s),
            code,
            message,
        } if s == StreamId(stream) => (code, message),
        other => panic!("expected an error on stream {stream}, got {other:?}"),
    };
    match next_control(ws).await {
        Control::Closed { stream: s } if s == StreamId(stream) => {}
        other => panic!("expected closed on stream {stream}, got {other:?}"),
    }
    (code, message)
}

#[tokio::test]
async fn opens_the_spec_rules_out_get_the_codes_it_names() {
    let agent = Agent::start();
    let mut ws = raw_connect(&agent, Some(&agent.token)).await.unwrap();
    assert!(matches!(
        hello(&mut ws, None, PROTOCOL_VERSION).await,
        Control::Welcome { .. }
    ));
    // §7: an unknown value of a known op is invalid_argument; only an unknown op is unsupported.
    let merge = r#"{"type":"open","stream":1,"op":"write","path":"f","if_exists":"merge"}"#;
    assert_eq!(
        open_error(&mut ws, 1, merge).await.0,
        ErrorCode::InvalidArgument
    );
    let teleport = r#"{"type":"open","stream":2,"op":"teleport"}"#;
    assert_eq!(
        open_error(&mut ws, 2, teleport).await.0,
        ErrorCode::Unsupported
    );
    let missing = r#"{"type":"open","stream":3,"op":"write"}"#;
    assert_eq!(
        open_error(&mut ws, 3, missing).await.0,
        ErrorCode::InvalidArgument
    );

    // §9 exec: timeout_ms is at least 1; environment names are not empty and hold no `=`.
    let cases = [
        (r#""timeout_ms":0"#, "timeout_ms"),
        (r#""env":{"A=B":"c"}"#, "A=B"),
        (r#""env":{"":"c"}"#, "name"),
        (r#""env":{"A":"c\u0000d"}"#, "NUL"),
    ];
    for (stream, (field, word)) in (10u32..).zip(cases) {
        let open = format!(
            r#"{{"type":"open","stream":{stream},"op":"exec","command":{{"argv":["true"]}},{field}}}"#
        );
        let (code, message) = open_error(&mut ws, stream, &open).await;
        assert_eq!(code, ErrorCode::InvalidArgument, "{field}: {message}");
        assert!(message.contains(word), "{field}: {message}");
    }
}

/// The close code the agent sends after `raw` bytes are written under a fresh connection.
async fn agent_close_code(agent: &Agent, raw: &[u8]) -> u16 {
    let mut ws = raw_connect(agent, Some(&agent.token)).await.unwrap();
    assert!(matches!(
        hello(&mut ws, None, PROTOCOL_VERSION).await,
        Control::Welcome { .. }
    ));
    let tokio_tungstenite::MaybeTlsStream::Plain(tcp) = ws.get_mut() else {
        panic!("a plain connection")
    };
    tcp.write_all(raw).await.unwrap();
    close_code(&mut ws).await
}

async fn close_code(ws: &mut Ws) -> u16 {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("agent answered in time");
        match msg {
            Some(Ok(Message::Close(Some(frame)))) => return u16::from(frame.code),
            Some(Ok(Message::Close(None))) | None => panic!("closed without a code"),
            Some(Ok(_)) => continue,
            Some(Err(e)) => panic!("expected a close frame, got {e}"),
        }
    }
}

/// A masked client frame: `first` (FIN, RSV, opcode), a zero mask, then `payload`.
fn masked_frame(first: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mut frame = vec![first, 0x80 | payload.len() as u8, 0, 0, 0, 0];
    frame.extend_from_slice(payload);
    frame
}

#[tokio::test]
async fn websocket_faults_close_with_rfc_6455_codes() {
    let agent = Agent::start();
    // A reserved bit no extension defines: protocol error.
    assert_eq!(
        agent_close_code(&agent, &masked_frame(0xC2, b"x")).await,
        1002
    );
    // A text message that is not UTF-8: invalid payload data.
    assert_eq!(
        agent_close_code(&agent, &masked_frame(0x81, &[0xff, 0xfe])).await,
        1007
    );
    // A message over the agent's limit (twice the largest frame): too big.
    let mut ws = raw_connect(&agent, Some(&agent.token)).await.unwrap();
    assert!(matches!(
        hello(&mut ws, None, PROTOCOL_VERSION).await,
        Control::Welcome { .. }
    ));
    let huge = vec![0u8; 2 * (6 + (1 << 20)) + 1];
    let _ = ws.send(Message::Binary(Bytes::from(huge))).await;
    assert_eq!(close_code(&mut ws).await, 1009);
}

/// A WebSocket upgrade over the Unix socket at `path`, with `token` as a bearer token.
async fn unix_upgrade(
    path: &std::path::Path,
    token: &str,
) -> Result<
    tokio_tungstenite::WebSocketStream<tokio::net::UnixStream>,
    tokio_tungstenite::tungstenite::Error,
> {
    let stream = tokio::net::UnixStream::connect(path).await.unwrap();
    let mut req = "ws://agent/".into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    tokio_tungstenite::client_async(req, stream)
        .await
        .map(|(ws, _)| ws)
}

#[tokio::test]
async fn an_agent_serves_a_unix_socket_of_its_own_to_its_user_only() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.sock");
    let agent = Agent::start_with(&["--listen-unix", path.to_str().unwrap()]);
    // The socket exists once the agent has bound it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "no socket at {path:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // It appears already restricted (it is bound elsewhere and linked here), and the place
    // it was bound in is gone.
    let meta = std::fs::metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["agent.sock"]);

    let ws = unix_upgrade(&path, &agent.token).await.unwrap();
    let session = Session::handshake(ws).await.unwrap();
    let out = session
        .exec(tether_proto::op::ExecSpec::shell("echo over unix"))
        .await
        .unwrap()
        .output()
        .await
        .unwrap();
    assert_eq!(out.stdout, b"over unix\n");

    // The token is checked there as on TCP.
    match unix_upgrade(&path, "wrong").await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 401)
        }
        other => panic!("expected a 401, got {:?}", other.map(|_| ())),
    }

    // A path already taken is refused, naming it.
    let out = std::process::Command::new(tether_e2e::bin("tether-agent"))
        .args([
            "serve",
            "--listen-unix",
            path.to_str().unwrap(),
            "--token",
            "t",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("cannot listen on the Unix socket") && stderr.contains("agent.sock"),
        "{stderr}"
    );
}
