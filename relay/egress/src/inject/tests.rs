//! The injector between a real client and a real TLS upstream, all on 127.0.0.1: a test CA
//! for the sandbox, another for the upstream (given to [`upstream_tls`] as the operator's CA
//! file), an upstream that echoes what reached it, and a front that accepts connections and
//! hands each to [`Injector::serve`] as the egress proxy does.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose};
use tether_client::api::SecretValue;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::rustls::client::danger::ServerCertVerifier;
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::{upstream_tls, InjectError, Injector};
use tether_relay_core::egress::policy::{BoundSecret, HostPattern};

const API_KEY: &str = "tether-secret-0123456789abcdef0123456789abcdef";
const API_VALUE: &str = "sk-live-abc/123+=";
const OTHER_KEY: &str = "tether-secret-fedcba9876543210fedcba9876543210";
const OTHER_VALUE: &str = "other-real-value";
const MIB: u64 = 1 << 20;

/// A CA: its certificate in PEM, and the issuer that signs with its key.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        // As egress::ca makes them: leaves only, signing certificates and CRLs only.
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// A server configuration presenting a certificate for `names`, signed by this CA.
    fn server(&self, names: &[&str]) -> Arc<ServerConfig> {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let key = PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// A client configuration trusting this CA only.
    fn client(&self) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.issuer.der().clone()).unwrap();
        let mut config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

/// Aborts its task when dropped, so a test's servers end with it.
struct Task(JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A TLS upstream: `/big?bytes=N` streams N bytes of `x`; anything else echoes its request
/// line, headers and body.
struct Upstream {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    /// Bytes of `/big` bodies handed to hyper so far.
    streamed: Arc<AtomicU64>,
    _task: Task,
}

async fn upstream(config: Arc<ServerConfig>) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let streamed = Arc::new(AtomicU64::new(0));
    let acceptor = TlsAcceptor::from(config);
    let (c, r, s) = (connections.clone(), requests.clone(), streamed.clone());
    let task = tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (acceptor, c, r, s) = (acceptor.clone(), c.clone(), r.clone(), s.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                c.fetch_add(1, Ordering::SeqCst);
                let service = service_fn(move |req| {
                    r.fetch_add(1, Ordering::SeqCst);
                    answer(req, s.clone())
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    Upstream {
        addr,
        connections,
        requests,
        streamed,
        _task: Task(task),
    }
}

type TestBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

async fn answer(
    mut req: Request<Incoming>,
    streamed: Arc<AtomicU64>,
) -> Result<Response<TestBody>, hyper::Error> {
    if let Some(protocol) = req.headers().get("upgrade").cloned() {
        // Upgraded: say which credentials came with the handshake, then echo.
        let seen = req.headers().get("authorization").cloned();
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            let mut io = TokioIo::new(upgrade.await.unwrap());
            let seen = seen.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            io.write_all(format!("authorization: {}\n", seen.unwrap_or_default()).as_bytes())
                .await
                .unwrap();
            let (mut r, mut w) = tokio::io::split(io);
            let _ = tokio::io::copy(&mut r, &mut w).await;
        });
        let mut response = Response::new(
            Full::new(Bytes::new())
                .map_err(|never| match never {})
                .boxed(),
        );
        *response.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
        response.headers_mut().insert("upgrade", protocol);
        response
            .headers_mut()
            .insert("connection", "upgrade".parse().unwrap());
        return Ok(response);
    }
    if let Some(bytes) = req.uri().query().and_then(|q| q.strip_prefix("bytes=")) {
        let total: u64 = bytes.parse().unwrap();
        let mut response = Response::new(
            Counted {
                left: total,
                streamed,
            }
            .boxed(),
        );
        response
            .headers_mut()
            .insert("content-length", total.to_string().parse().unwrap());
        return Ok(response);
    }
    // What a careless upstream does: repeat credentials and the query in its headers.
    let reflected = req.headers().get("authorization").cloned();
    let location = format!("/next?{}", req.uri().query().unwrap_or(""));
    let mut echo = format!("{} {}\n", req.method(), req.uri());
    for (name, value) in req.headers() {
        echo.push_str(&format!(
            "{name}: {}\n",
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    let body = req.into_body().collect().await?.to_bytes();
    echo.push('\n');
    echo.push_str(&String::from_utf8_lossy(&body));
    let mut response = Response::new(
        Full::new(Bytes::from(echo))
            .map_err(|never| match never {})
            .boxed(),
    );
    if let Some(reflected) = reflected {
        response
            .headers_mut()
            .insert("x-seen-authorization", reflected);
    }
    response
        .headers_mut()
        .insert("location", location.parse().unwrap());
    Ok(response)
}

/// `left` bytes of `x` in 64 KiB frames, counting what hyper takes.
struct Counted {
    left: u64,
    streamed: Arc<AtomicU64>,
}

static CHUNK: [u8; 64 << 10] = [b'x'; 64 << 10];

impl Body for Counted {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if self.left == 0 {
            return std::task::Poll::Ready(None);
        }
        let n = self.left.min(CHUNK.len() as u64);
        self.left -= n;
        self.streamed.fetch_add(n, Ordering::SeqCst);
        std::task::Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
            &CHUNK[..n as usize],
        )))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

/// The egress proxy's part, played by the test: every connection to `addr` is for `host`,
/// served by the injector towards `upstream`; each serve's outcome goes to `outcomes`.
struct Front {
    addr: SocketAddr,
    outcomes: mpsc::UnboundedReceiver<Result<(), InjectError>>,
    _task: Task,
}

async fn front(injector: Arc<Injector>, host: &str, upstream: Vec<SocketAddr>) -> Front {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, outcomes) = mpsc::unbounded_channel();
    let host = host.to_string();
    let task = tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (injector, host, upstream, tx) =
                (injector.clone(), host.clone(), upstream.clone(), tx.clone());
            tokio::spawn(async move {
                let outcome = injector.serve(tcp, &host, addr.port(), &upstream).await;
                let _ = tx.send(outcome);
            });
        }
    });
    Front {
        addr,
        outcomes,
        _task: Task(task),
    }
}

fn bound(name: &str, placeholder: &str, value: &str, host: &str) -> BoundSecret {
    BoundSecret {
        name: name.into(),
        placeholder: placeholder.into(),
        value: SecretValue::new(value),
        hosts: vec![HostPattern::parse(host).unwrap()],
    }
}

/// A sandbox CA, an upstream CA, and an injector with API_KEY bound to api.test and OTHER_KEY
/// to other.test, trusting the upstream CA as `--egress-ca-file` would.
struct Setup {
    sandbox_ca: Ca,
    upstream_ca: Ca,
    injector: Arc<Injector>,
}

fn setup() -> Setup {
    let sandbox_ca = Ca::new();
    let upstream_ca = Ca::new();
    let ca_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca_file.path(), upstream_ca.cert_pem()).unwrap();
    let tls = upstream_tls(Some(ca_file.path())).unwrap();
    let injector = Injector::new(
        &sandbox_ca.cert_pem(),
        &sandbox_ca.key_pem(),
        vec![
            bound("API_KEY", API_KEY, API_VALUE, "api.test"),
            bound("OTHER_KEY", OTHER_KEY, OTHER_VALUE, "other.test"),
        ],
        Arc::new(tls),
    )
    .unwrap();
    Setup {
        sandbox_ca,
        upstream_ca,
        injector: Arc::new(injector),
    }
}

/// A client as the sandbox has one: trusting the sandbox's CA only, resolving `host` to the
/// front.
fn client(ca: &Ca, host: &str, front: &Front) -> reqwest::Client {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.cert_pem().as_bytes()).unwrap())
        .resolve(host, front.addr)
        .no_proxy()
        .build()
        .unwrap()
}

fn url(host: &str, front: &Front, target: &str) -> String {
    format!("https://{host}:{}{target}", front.addr.port())
}

/// A TLS connection to the front with `sni`, trusting `config`.
async fn raw_tls(
    config: Arc<ClientConfig>,
    sni: &str,
    front: &Front,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(front.addr).await?;
    TlsConnector::from(config)
        .connect(ServerName::try_from(sni.to_string()).unwrap(), tcp)
        .await
}

/// Everything the peer sends until it closes (or resets: the answer is what matters).
async fn read_all(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> String {
    let mut all = Vec::new();
    let mut buf = [0u8; 16 << 10];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 {
            break;
        }
        all.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&all).into_owned()
}

#[tokio::test]
async fn secrets_reach_the_upstream_in_headers_basic_credentials_and_the_query() {
    let s = setup();
    let up = upstream(s.upstream_ca.server(&["api.test"])).await;
    let front = front(s.injector.clone(), "api.test", vec![up.addr]).await;
    let client = client(&s.sandbox_ca, "api.test", &front);

    let echo = client
        .get(url(
            "api.test",
            &front,
            &format!("/v1/models?key={API_KEY}&x=1"),
        ))
        .bearer_auth(API_KEY)
        .header("x-api-key", format!("custom {API_KEY}"))
        .send()
        .await
        .unwrap();
    assert_eq!(echo.status(), 200);
    // Echoed in the response's headers, the value goes back to being the placeholder.
    assert_eq!(
        echo.headers()["x-seen-authorization"],
        format!("Bearer {API_KEY}").as_str()
    );
    assert_eq!(
        echo.headers()["location"],
        format!("/next?key={API_KEY}&x=1").as_str()
    );
    let echo = echo.text().await.unwrap();
    assert!(
        echo.starts_with("GET /v1/models?key=sk-live-abc%2F123%2B%3D&x=1\n"),
        "{echo}"
    );
    assert!(
        echo.contains(&format!("\nauthorization: Bearer {API_VALUE}\n")),
        "{echo}"
    );
    assert!(
        echo.contains(&format!("\nx-api-key: custom {API_VALUE}\n")),
        "{echo}"
    );
    assert!(!echo.contains(API_KEY), "{echo}");

    // Basic credentials are base64: replaced inside. Bodies are never rewritten.
    let echo = client
        .post(url("api.test", &front, "/v1/echo"))
        .basic_auth("user", Some(API_KEY))
        .body(format!("{{\"key\": \"{API_KEY}\"}}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("user:{API_VALUE}"));
    assert!(
        echo.contains(&format!("\nauthorization: Basic {basic}\n")),
        "{echo}"
    );
    assert!(
        echo.ends_with(&format!("\n\n{{\"key\": \"{API_KEY}\"}}")),
        "{echo}"
    );

    // Kept alive on both sides: two requests, one connection to the upstream.
    assert_eq!(up.requests.load(Ordering::SeqCst), 2);
    assert_eq!(up.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn placeholders_of_secrets_bound_to_other_hosts_arrive_unchanged() {
    let s = setup();
    let up = upstream(s.upstream_ca.server(&["api.test", "other.test"])).await;
    for (host, foreign, foreign_value) in [
        ("api.test", OTHER_KEY, OTHER_VALUE),
        ("other.test", API_KEY, API_VALUE),
    ] {
        let front = front(s.injector.clone(), host, vec![up.addr]).await;
        let echo = client(&s.sandbox_ca, host, &front)
            .get(url(host, &front, &format!("/?key={foreign}")))
            .bearer_auth(foreign)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            echo.starts_with(&format!("GET /?key={foreign}\n")),
            "{echo}"
        );
        assert!(
            echo.contains(&format!("\nauthorization: Bearer {foreign}\n")),
            "{echo}"
        );
        assert!(!echo.contains(foreign_value), "{echo}");
    }
}

/// An upstream that closes each connection after one response, without saying so (as servers
/// do with idle keep-alive connections): the injector must notice and open another.
async fn one_shot_upstream(config: Arc<ServerConfig>) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let acceptor = TlsAcceptor::from(config);
    let (c, r) = (connections.clone(), requests.clone());
    let task = tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let Ok(mut tls) = acceptor.accept(tcp).await else {
                continue;
            };
            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                match tls.read_u8().await {
                    Ok(b) => head.push(b),
                    Err(_) => break,
                }
            }
            if !head.ends_with(b"\r\n\r\n") {
                continue;
            }
            r.fetch_add(1, Ordering::SeqCst);
            let body = format!("connection {n}");
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = tls.write_all(answer.as_bytes()).await;
            let _ = tls.shutdown().await;
        }
    });
    Upstream {
        addr,
        connections,
        requests,
        streamed: Arc::new(AtomicU64::new(0)),
        _task: Task(task),
    }
}

#[tokio::test]
async fn an_upstream_that_closes_between_requests_is_dialled_again() {
    let s = setup();
    let up = one_shot_upstream(s.upstream_ca.server(&["api.test"])).await;
    let front = front(s.injector.clone(), "api.test", vec![up.addr]).await;
    let client = client(&s.sandbox_ca, "api.test", &front);
    for n in 1..=3 {
        let response = client
            .get(url("api.test", &front, "/"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.text().await.unwrap(), format!("connection {n}"));
    }
    assert_eq!(up.requests.load(Ordering::SeqCst), 3);
}

/// Log lines, as the relay would write them, into a buffer a test can read.
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// One thread (tokio's test default), so every task logs to the subscriber set here.
#[tokio::test]
async fn no_log_line_holds_a_secret_value() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let s = setup();
    let up = upstream(s.upstream_ca.server(&["api.test"])).await;
    let good = front(s.injector.clone(), "api.test", vec![up.addr]).await;
    let sandbox = client(&s.sandbox_ca, "api.test", &good);
    let response = sandbox
        .get(url("api.test", &good, &format!("/?key={API_KEY}")))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap();
    // Refused and failed requests log too.
    let refused = sandbox
        .get(url("api.test", &good, "/"))
        .header("host", "evil.test")
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 421);
    let stranger = upstream(Ca::new().server(&["api.test"])).await;
    let bad = front(s.injector.clone(), "api.test", vec![stranger.addr]).await;
    let failed = client(&s.sandbox_ca, "api.test", &bad)
        .get(url("api.test", &bad, &format!("/?key={API_KEY}")))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(failed.status(), 502);

    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("carries API_KEY"), "{logs}");
    assert!(logs.contains("cannot be verified"), "{logs}");
    assert!(!logs.contains(API_VALUE), "{logs}");
    assert!(!logs.contains("sk-live-abc%2F123"), "{logs}");
}

#[tokio::test]
async fn a_request_naming_another_host_is_refused_before_anything_leaves() {
    let s = setup();
    let up = upstream(s.upstream_ca.server(&["api.test"])).await;
    let front = front(s.injector.clone(), "api.test", vec![up.addr]).await;
    let mut tls = raw_tls(s.sandbox_ca.client(), "api.test", &front)
        .await
        .unwrap();
    // A front end shared by many sites routes by Host: the secret must not ride along.
    let request = format!(
        "GET /?k={API_KEY} HTTP/1.1\r\nhost: evil.test\r\nauthorization: Bearer {API_KEY}\r\n\
         connection: close\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let answer = read_all(&mut tls).await;
    assert!(answer.starts_with("HTTP/1.1 421 "), "{answer}");
    assert!(
        answer.contains("this connection is for api.test"),
        "{answer}"
    );
    assert!(!answer.contains(API_VALUE), "{answer}");
    assert_eq!(up.requests.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_upgrade_handshake_carries_the_secret_then_bytes_flow_both_ways() {
    let s = setup();
    let up = upstream(s.upstream_ca.server(&["api.test"])).await;
    let front = front(s.injector.clone(), "api.test", vec![up.addr]).await;
    let mut tls = raw_tls(s.sandbox_ca.client(), "api.test", &front)
        .await
        .unwrap();
    let request = format!(
        "GET /v1/realtime HTTP/1.1\r\nhost: api.test\r\nconnection: Upgrade\r\n\
         upgrade: tether-echo\r\nauthorization: Bearer {API_KEY}\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(tls.read_u8().await.unwrap());
    }
    let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101 "), "{head}");
    assert!(head.contains("\r\nupgrade: tether-echo\r\n"), "{head}");

    let mut line = Vec::new();
    while !line.ends_with(b"\n") {
        line.push(tls.read_u8().await.unwrap());
    }
    assert_eq!(
        String::from_utf8(line).unwrap(),
        format!("authorization: Bearer {API_VALUE}\n")
    );
    // After the handshake nothing is rewritten: the placeholder goes through as it is.
    let message = format!("ping {API_KEY}\n");
    tls.write_all(message.as_bytes()).await.unwrap();
    let mut echoed = vec![0u8; message.len()];
    tls.read_exact(&mut echoed).await.unwrap();
    assert_eq!(echoed, message.as_bytes());
}

/// An HTTP/2 connection to the front, as a sandbox's client that prefers it opens one.
async fn h2(s: &Setup, front: &Front) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let mut config = (*s.sandbox_ca.client()).clone();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tls = raw_tls(Arc::new(config), "api.test", front).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    sender
}

#[tokio::test]
async fn http2_streams_carry_secrets_side_by_side() {
    let s = setup();
    let up = upstream(s.upstream_ca.server(&["api.test"])).await;
    let front = front(s.injector.clone(), "api.test", vec![up.addr]).await;
    let sender = h2(&s, &front).await;
    let port = front.addr.port();

    let streams = (0..8).map(|n| {
        let mut sender = sender.clone();
        async move {
            let request = Request::get(format!("https://api.test:{port}/{n}?key={API_KEY}"))
                .header("authorization", format!("Bearer {API_KEY}"))
                .body(Full::new(Bytes::new()))
                .unwrap();
            let response = sender.send_request(request).await.unwrap();
            assert_eq!(response.status(), 200);
            let echo = response.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8(echo.to_vec()).unwrap()
        }
    });
    for (n, echo) in futures_util::future::join_all(streams)
        .await
        .into_iter()
        .enumerate()
    {
        assert!(
            echo.starts_with(&format!("GET /{n}?key=sk-live-abc%2F123%2B%3D\n")),
            "{echo}"
        );
        assert!(
            echo.contains(&format!("\nauthorization: Bearer {API_VALUE}\n")),
            "{echo}"
        );
        assert!(
            echo.contains(&format!("\nhost: api.test:{port}\n")),
            "{echo}"
        );
    }
    assert_eq!(up.requests.load(Ordering::SeqCst), 8);

    // The authority of an HTTP/2 request is checked as the Host header is.
    let request = Request::get("https://evil.test/")
        .header("authorization", format!("Bearer {API_KEY}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.clone().send_request(request).await.unwrap();
    assert_eq!(response.status(), 421);
    assert_eq!(up.requests.load(Ordering::SeqCst), 8);

    // Header lists are bounded as HTTP/1.1 heads are: a 1 MiB one goes nowhere (a 431, or a
    // GOAWAY when it spans more frames than the injector reads).
    let request = Request::get(format!("https://api.test:{port}/"))
        .header("x-big", "a".repeat(MIB as usize))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let outcome = h2(&s, &front).await.send_request(request).await;
    assert!(
        outcome.as_ref().map_or(true, |r| r.status() == 431),
        "{:?}",
        outcome.map(|r| r.status())
    );
    assert_eq!(up.requests.load(Ordering::SeqCst), 8);
}

#[tokio::test]
async fn an_upstream_that_cannot_prove_its_name_gets_a_502() {
    let s = setup();
    let stranger = Ca::new();
    let untrusted = upstream(stranger.server(&["api.test"])).await;
    let misnamed = upstream(s.upstream_ca.server(&["elsewhere.test"])).await;
    for up in [&untrusted, &misnamed] {
        let front = front(s.injector.clone(), "api.test", vec![up.addr]).await;
        let response = client(&s.sandbox_ca, "api.test", &front)
            .get(url("api.test", &front, "/"))
            .bearer_auth(API_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 502);
        let body = response.text().await.unwrap();
        assert!(
            body.contains("the certificate of api.test:") && body.contains("cannot be verified"),
            "{body}"
        );
        assert!(!body.contains(API_VALUE), "{body}");
        assert_eq!(up.requests.load(Ordering::SeqCst), 0);
    }
}

#[tokio::test]
async fn an_upstream_that_does_not_answer_gets_a_502_saying_so() {
    let s = setup();
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let front = front(s.injector.clone(), "api.test", vec![addr]).await;
    let response = client(&s.sandbox_ca, "api.test", &front)
        .get(url("api.test", &front, "/"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
    let body = response.text().await.unwrap();
    assert!(
        body.contains(&format!(
            "cannot connect to api.test:{} at {addr}",
            front.addr.port()
        )),
        "{body}"
    );
}

#[tokio::test]
async fn a_request_with_a_1_mib_header_is_refused() {
    let s = setup();
    let up = upstream(s.upstream_ca.server(&["api.test"])).await;
    let front = front(s.injector.clone(), "api.test", vec![up.addr]).await;
    let tls = raw_tls(s.sandbox_ca.client(), "api.test", &front)
        .await
        .unwrap();
    let (mut reader, mut writer) = tokio::io::split(tls);
    let big = "a".repeat(MIB as usize);
    let request = format!("GET / HTTP/1.1\r\nhost: api.test\r\nx-big: {big}\r\n\r\n");
    // The injector stops reading long before the end: write on the side, read the answer.
    let writing = tokio::spawn(async move {
        let _ = writer.write_all(request.as_bytes()).await;
        writer
    });
    let answer = read_all(&mut reader).await;
    assert!(
        answer.starts_with("HTTP/1.1 431 "),
        "{}",
        &answer[..answer.len().min(200)]
    );
    assert_eq!(up.requests.load(Ordering::SeqCst), 0);
    drop(writing.await);
}

#[tokio::test]
async fn a_100_mib_download_streams_through_without_being_buffered() {
    let s = setup();
    let up = upstream(s.upstream_ca.server(&["api.test"])).await;
    let front = front(s.injector.clone(), "api.test", vec![up.addr]).await;
    let total = 100 * MIB;
    let mut response = client(&s.sandbox_ca, "api.test", &front)
        .get(url("api.test", &front, &format!("/big?bytes={total}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.content_length(), Some(total));

    let mut read = 0u64;
    while read < MIB {
        read += response.chunk().await.unwrap().unwrap().len() as u64;
    }
    // The client stops reading. Every buffer on the way fills, then the upstream must stall:
    // wait until its count stops moving (bounded), then see how far ahead it got.
    let mut last = up.streamed.load(Ordering::SeqCst);
    let mut still = 0;
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = up.streamed.load(Ordering::SeqCst);
        still = if now == last { still + 1 } else { 0 };
        last = now;
        if still == 10 {
            break;
        }
    }
    assert_eq!(still, 10, "the upstream never stalled");
    let ahead = last - read;
    // Socket buffers on three loopback hops, TLS records and hyper's write buffers: a few
    // MiB each at most; a proxy that buffered bodies would have taken all 100.
    assert!(ahead < 40 * MIB, "{} MiB in flight", ahead / MIB);

    while let Some(chunk) = response.chunk().await.unwrap() {
        assert!(chunk.iter().all(|&b| b == b'x'));
        read += chunk.len() as u64;
    }
    assert_eq!(read, total);
}

#[tokio::test]
async fn the_leaf_names_the_host_and_chains_to_the_sandbox_ca() {
    let s = setup();
    let front = front(s.injector.clone(), "api.test", vec![]).await;
    let leaf = |tls: &tokio_rustls::client::TlsStream<TcpStream>| {
        let certs = tls.get_ref().1.peer_certificates().unwrap();
        assert_eq!(certs.len(), 1, "the leaf alone; the sandbox has the CA");
        certs[0].clone()
    };
    let first = leaf(
        &raw_tls(s.sandbox_ca.client(), "api.test", &front)
            .await
            .unwrap(),
    );
    let second = leaf(
        &raw_tls(s.sandbox_ca.client(), "API.test", &front)
            .await
            .unwrap(),
    );
    assert_eq!(first, second, "one leaf per host, cached");

    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(s.sandbox_ca.cert_pem().as_bytes()).unwrap())
        .unwrap();
    let verifier = WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(ring::default_provider()),
    )
    .build()
    .unwrap();
    let verify = |name: &str| {
        verifier.verify_server_cert(
            &first,
            &[],
            &ServerName::try_from(name.to_string()).unwrap(),
            &[],
            UnixTime::now(),
        )
    };
    verify("api.test").unwrap();
    assert!(matches!(
        verify("other.test"),
        Err(rustls::Error::InvalidCertificate(_))
    ));

    // A client that does not trust the sandbox's CA gets no connection.
    let stranger = Ca::new();
    assert!(raw_tls(stranger.client(), "api.test", &front)
        .await
        .is_err());
}

#[tokio::test]
async fn a_client_hello_naming_another_host_is_refused() {
    let s = setup();
    let mut front = front(s.injector.clone(), "api.test", vec![]).await;
    assert!(raw_tls(s.sandbox_ca.client(), "other.test", &front)
        .await
        .is_err());
    let outcome = front.outcomes.recv().await.unwrap();
    assert!(
        matches!(&outcome, Err(InjectError::SniMismatch { host, sni }) if host == "api.test" && sni == "other.test"),
        "{outcome:?}"
    );
}

#[test]
fn a_ca_that_cannot_sign_is_refused_at_start() {
    let tls = Arc::new(upstream_tls(None).unwrap());
    let ca = Ca::new();
    let other = Ca::new();
    let new = |cert: &str, key: &str| Injector::new(cert, key, vec![], tls.clone()).unwrap_err();

    let err = new(&ca.cert_pem(), &other.key_pem()).to_string();
    assert!(
        err.contains("does not verify against its certificate"),
        "{err}"
    );
    let err = new(&ca.cert_pem(), "not a key").to_string();
    assert!(err.contains("PKCS#8 PEM private key"), "{err}");
    let err = new("not a certificate", &ca.key_pem()).to_string();
    assert!(err.contains("certificate is not PEM"), "{err}");

    // A certificate that is not a CA's cannot issue.
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["ca.test".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca.issuer)
        .unwrap();
    let err = new(&leaf.pem(), &leaf_key.serialize_pem()).to_string();
    assert!(err.contains("not a CA's"), "{err}");
}

#[test]
fn the_egress_ca_file_must_hold_pem_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, content: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        path
    };
    let missing = dir.path().join("missing.pem");
    let err = upstream_tls(Some(&missing)).unwrap_err();
    assert!(matches!(err, InjectError::CaFileUnreadable { .. }), "{err}");
    assert!(err.to_string().contains("--egress-ca-file"), "{err}");

    let err = upstream_tls(Some(&write("text.pem", "hello\n"))).unwrap_err();
    assert!(matches!(err, InjectError::CaFileEmpty { .. }), "{err}");
    let key_only = Ca::new().key_pem();
    let err = upstream_tls(Some(&write("key.pem", &key_only))).unwrap_err();
    assert!(matches!(err, InjectError::CaFileEmpty { .. }), "{err}");
    let err = upstream_tls(Some(&write(
        "cut.pem",
        "-----BEGIN CERTIFICATE-----\nMIIB\n",
    )))
    .unwrap_err();
    assert!(matches!(err, InjectError::CaFilePem { .. }), "{err}");
    assert!(err.to_string().contains("cut.pem"), "{err}");

    upstream_tls(Some(&write("ok.pem", &Ca::new().cert_pem()))).unwrap();
}

#[test]
fn debug_output_names_secrets_without_their_values() {
    let s = setup();
    let shown = format!("{:?}", s.injector);
    assert!(shown.contains("API_KEY@api.test"), "{shown}");
    assert!(
        !shown.contains(API_VALUE) && !shown.contains(OTHER_VALUE),
        "{shown}"
    );
    assert!(s.injector.intercepts("api.test") && s.injector.intercepts("OTHER.test."));
    assert!(!s.injector.intercepts("pypi.org"));
}
