//! Route-level tests: a real relay on port 0, driven over real sockets, with a fake provider
//! whose "agents" are an in-test WebSocket echo server that checks the agent token.

mod api;
mod lifecycle;
mod policy;
mod recovery;
mod secrets;
mod tunnel;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{SinkExt, StreamExt};
use reqwest::StatusCode;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::header::AUTHORIZATION;
use tokio_tungstenite::tungstenite::http::HeaderMap;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::{start_with, PolicyConfig, RelayConfig, RunningRelay};
use tether_client::api::{ErrorBody, SandboxInfo};
use tether_relay_core::provider::upgrade::upgrade;
use tether_relay_core::provider::{
    AgentSocket, Created, Provider, ProviderError, SandboxHandle, SandboxSpec, SandboxState,
};

/// What the fake agent does when it receives this message: close the connection itself.
const AGENT_CLOSE_COMMAND: &[u8] = b"please close";
/// The reaper's tick in tests: short, so timeouts are observed promptly.
const TEST_REAP_INTERVAL: Duration = Duration::from_millis(50);
/// How long a test waits for an expected change before failing.
const DEADLINE: Duration = Duration::from_secs(15);

/// A provider that runs no processes: "sandboxes" are entries in a map, and every connect
/// reaches the shared echo agent, which accepts only the sandbox's own agent token.
#[derive(Default)]
pub(super) struct FakeProvider {
    /// Live sandboxes: id → agent token.
    sandboxes: Mutex<HashMap<String, String>>,
    pub creates: AtomicUsize,
    pub deletes: AtomicUsize,
    pub connects: AtomicUsize,
    pub renews: AtomicUsize,
    /// Makes every connect fail as if the agent were unreachable.
    pub refuse_connect: AtomicBool,
    /// Plays a provider that runs sandboxes on this host (as `local` does).
    pub runs_here: AtomicBool,
    /// The spec of the last create, as the relay passed it on.
    pub last_spec: Mutex<Option<SandboxSpec>>,
    /// Makes every state call fail as a provider's outage (a 5xx, a network error) would.
    pub cannot_answer: AtomicBool,
    /// Makes every connect say the sandbox is gone while `state` still finds it: a false
    /// report the relay must not delete on.
    pub connect_says_gone: AtomicBool,
    /// Where every connect goes instead of the echo agent, when set (a raw agent a test
    /// plays itself).
    pub agent_override: Mutex<Option<SocketAddr>>,
    agent_addr: Mutex<Option<SocketAddr>>,
}

impl FakeProvider {
    /// Loses a sandbox behind the relay's back, as a host reboot would.
    pub(super) fn lose(&self, id: &str) {
        self.sandboxes.lock().unwrap().remove(id);
    }

    pub(super) fn has(&self, id: &str) -> bool {
        self.sandboxes.lock().unwrap().contains_key(id)
    }

    /// Every live sandbox's agent token.
    pub(super) fn agent_tokens(&self) -> Vec<String> {
        self.sandboxes.lock().unwrap().values().cloned().collect()
    }

    fn knows_token(&self, token: &str) -> bool {
        self.sandboxes.lock().unwrap().values().any(|t| t == token)
    }
}

#[async_trait]
impl Provider for FakeProvider {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn runs_here(&self) -> bool {
        self.runs_here.load(Ordering::SeqCst)
    }

    async fn create(
        &self,
        id: &str,
        agent_token: &str,
        spec: &SandboxSpec,
    ) -> Result<Created, ProviderError> {
        *self.last_spec.lock().unwrap() = Some(spec.clone());
        // Slow enough that concurrent get-or-creates overlap.
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.creates.fetch_add(1, Ordering::SeqCst);
        self.sandboxes
            .lock()
            .unwrap()
            .insert(id.to_string(), agent_token.to_string());
        let addr = self.agent_addr.lock().unwrap().expect("echo agent running");
        Ok(Created {
            provider_ref: format!("fake-{id}"),
            meta: serde_json::json!({ "agent": addr.to_string() }),
        })
    }

    async fn state(&self, sandbox: &SandboxHandle) -> Result<SandboxState, ProviderError> {
        if self.cannot_answer.load(Ordering::SeqCst) {
            return Err(anyhow::anyhow!("the fake provider answered HTTP 503").into());
        }
        Ok(if self.has(&sandbox.id) {
            SandboxState::Running
        } else {
            SandboxState::Gone
        })
    }

    async fn delete(&self, sandbox: &SandboxHandle) -> Result<(), ProviderError> {
        self.deletes.fetch_add(1, Ordering::SeqCst);
        self.lose(&sandbox.id);
        Ok(())
    }

    async fn renew(&self, sandbox: &SandboxHandle, _ttl: Duration) -> Result<(), ProviderError> {
        self.renews.fetch_add(1, Ordering::SeqCst);
        match self.has(&sandbox.id) {
            true => Ok(()),
            false => Err(ProviderError::Gone(sandbox.id.clone())),
        }
    }

    async fn connect(&self, sandbox: &SandboxHandle) -> Result<AgentSocket, ProviderError> {
        self.connects.fetch_add(1, Ordering::SeqCst);
        if !self.has(&sandbox.id) || self.connect_says_gone.load(Ordering::SeqCst) {
            return Err(ProviderError::Gone(sandbox.id.clone()));
        }
        if self.refuse_connect.load(Ordering::SeqCst) {
            return Err(anyhow::anyhow!("connection refused by the fake agent").into());
        }
        // The address comes from the stored handle, as after a relay restart.
        let addr = match *self.agent_override.lock().unwrap() {
            Some(addr) => addr.to_string(),
            None => sandbox.meta["agent"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        };
        let tcp = TcpStream::connect(&addr)
            .await
            .map_err(anyhow::Error::from)?;
        let mut headers = HeaderMap::new();
        let bearer = format!("Bearer {}", sandbox.agent_token);
        headers.insert(AUTHORIZATION, bearer.parse().map_err(anyhow::Error::from)?);
        upgrade(tcp, "ws://sandbox/v1/agent", headers)
            .await
            .map_err(|e| anyhow::Error::from(e).into())
    }
}

/// The fake agent: echoes every data message; closes when asked to.
async fn serve_echo_agent(listener: TcpListener, provider: Arc<FakeProvider>) {
    while let Ok((tcp, _)) = listener.accept().await {
        let provider = provider.clone();
        tokio::spawn(async move {
            #[expect(
                clippy::result_large_err,
                reason = "the callback's signature is tungstenite's"
            )]
            let check = |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
                let token = req
                    .headers()
                    .get(AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(tether_proto::auth::bearer)
                    .unwrap_or_default();
                if provider.knows_token(token) {
                    Ok(resp)
                } else {
                    let mut refuse = ErrorResponse::new(Some("wrong sandbox token".into()));
                    *refuse.status_mut() =
                        tokio_tungstenite::tungstenite::http::StatusCode::UNAUTHORIZED;
                    Err(refuse)
                }
            };
            let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tcp, check).await else {
                return;
            };
            while let Some(Ok(msg)) = ws.next().await {
                let reply = match msg {
                    Message::Binary(data) if data == AGENT_CLOSE_COMMAND => {
                        Message::Close(Some(CloseFrame {
                            code: CloseCode::Normal,
                            reason: "bye".into(),
                        }))
                    }
                    Message::Binary(_) | Message::Text(_) => msg,
                    _ => continue,
                };
                if ws.send(reply).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// A relay on an ephemeral port with a fake provider, in a temporary data directory.
pub(super) struct TestRelay {
    pub relay: Option<RunningRelay>,
    pub provider: Arc<FakeProvider>,
    pub dir: tempfile::TempDir,
    pub http: reqwest::Client,
    /// The policy every (re)start gets.
    pub policy: PolicyConfig,
    /// The peer timeout every (re)start gets.
    pub peer_timeout: Duration,
}

impl TestRelay {
    pub(super) async fn start() -> TestRelay {
        TestRelay::start_with_policy(PolicyConfig::default(), false).await
    }

    /// A relay that takes a tunnel's silent side for dead after `peer_timeout`.
    pub(super) async fn start_with_peer_timeout(peer_timeout: Duration) -> TestRelay {
        TestRelay::start_with(PolicyConfig::default(), false, peer_timeout).await
    }

    /// A relay with `policy`, whose fake provider plays a local one if `runs_here`.
    pub(super) async fn start_with_policy(policy: PolicyConfig, runs_here: bool) -> TestRelay {
        let peer_timeout = super::ConnectionLimits::default().peer_timeout;
        TestRelay::start_with(policy, runs_here, peer_timeout).await
    }

    async fn start_with(
        policy: PolicyConfig,
        runs_here: bool,
        peer_timeout: Duration,
    ) -> TestRelay {
        let provider = Arc::new(FakeProvider::default());
        provider.runs_here.store(runs_here, Ordering::SeqCst);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        *provider.agent_addr.lock().unwrap() = Some(listener.local_addr().unwrap());
        tokio::spawn(serve_echo_agent(listener, provider.clone()));
        let mut relay = TestRelay {
            relay: None,
            provider,
            dir: tempfile::tempdir().unwrap(),
            http: reqwest::Client::new(),
            policy,
            peer_timeout,
        };
        relay.relay = Some(relay.start_relay().await.unwrap());
        relay
    }

    pub(super) async fn start_relay(&self) -> anyhow::Result<RunningRelay> {
        let config = RelayConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: self.dir.path().join("data"),
            agent_binary: "/nonexistent/tether-agent".into(),
            reap_interval: TEST_REAP_INTERVAL,
            policy: self.policy.clone(),
            tls: None,
            egress: Default::default(),
            docker_host: None,
            connections: super::ConnectionLimits {
                peer_timeout: self.peer_timeout,
                ..Default::default()
            },
            database: Default::default(),
            advertise: None,
            preview_domain: None,
        };
        let provider: Arc<dyn Provider> = self.provider.clone();
        start_with(config, [("fake", provider)].into_iter().collect()).await
    }

    /// Shuts the relay down and starts a new one on the same data directory.
    pub(super) async fn restart(&mut self) {
        if let Some(relay) = self.relay.take() {
            relay.shutdown().await;
        }
        self.relay = Some(self.start_relay().await.unwrap());
    }

    fn running(&self) -> &RunningRelay {
        self.relay.as_ref().expect("relay running")
    }

    pub(super) fn admin(&self) -> String {
        self.running().admin_token.clone()
    }

    pub(super) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.running().url())
    }

    /// Mints a token for `tenant` with the admin token.
    pub(super) async fn token_for(&self, tenant: &str) -> String {
        self.mint(&self.admin(), tenant, false).await
    }

    /// Mints a token for `tenant` (an admin token if `admin`) with `by`; panics unless 201.
    pub(super) async fn mint(&self, by: &str, tenant: &str, admin: bool) -> String {
        let (status, body) = self
            .call(
                "POST",
                "/v1/tokens",
                by,
                Some(serde_json::json!({"tenant": tenant, "admin": admin})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["token"].as_str().unwrap().to_string()
    }

    /// One request; returns the status and the JSON body (`null` when empty).
    pub(super) async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<serde_json::Value>,
    ) -> (StatusCode, serde_json::Value) {
        let mut req = self
            .http
            .request(method.parse().unwrap(), self.url(path))
            .bearer_auth(token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        let json = if text.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
        };
        (status, json)
    }

    /// Creates a sandbox; panics unless it answers 201.
    pub(super) async fn create(&self, token: &str, body: serde_json::Value) -> SandboxInfo {
        let (status, body) = self.call("POST", "/v1/sandboxes", token, Some(body)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        serde_json::from_value(body).unwrap()
    }

    /// Opens a tunnel to sandbox `id`.
    pub(super) async fn tunnel(
        &self,
        id: &str,
        token: &str,
    ) -> Result<WebSocketStream<MaybeTlsStream<TcpStream>>, tokio_tungstenite::tungstenite::Error>
    {
        let url = self
            .url(&format!("/v1/sandboxes/{id}/ws"))
            .replacen("http", "ws", 1);
        let mut req = url.into_client_request().unwrap();
        let bearer = format!("Bearer {token}").parse().unwrap();
        req.headers_mut().insert(AUTHORIZATION, bearer);
        tokio_tungstenite::connect_async(req)
            .await
            .map(|(ws, _)| ws)
    }
}

/// Asserts an error body: the status, the code, and words the message must contain.
pub(super) fn assert_error(
    got: &(StatusCode, serde_json::Value),
    status: StatusCode,
    code: &str,
    words: &[&str],
) {
    assert_eq!(got.0, status, "{}", got.1);
    let body: ErrorBody = serde_json::from_value(got.1.clone())
        .unwrap_or_else(|e| panic!("not an ErrorBody ({e}): {}", got.1));
    assert_eq!(body.error.code, code, "{}", got.1);
    for word in words {
        assert!(
            body.error.message.contains(word),
            "{word:?} not in {:?}",
            body.error.message
        );
    }
}

/// Polls `check` until it holds, failing the test after [`DEADLINE`].
pub(super) async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
