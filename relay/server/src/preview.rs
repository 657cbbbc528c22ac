//! Preview URLs: a browser reaches a port inside a sandbox through the relay, either by host
//! name, `http://{port}-{id}.localhost:{relay port}/...` (every path of the app works as it
//! would at the root), or by path, `http://{relay}/preview/{id}/{port}/...` (for clients
//! that cannot resolve `*.localhost`; an app that writes absolute links escapes the prefix).
//! Both are `https://` when the relay serves TLS (its certificate must then also name
//! `*.localhost` for the host form). `*.localhost` names this machine only: a relay that
//! clients reach over the network is given a preview domain (`tether serve --preview-domain
//! preview.example.com`, with a wildcard DNS record for `*.preview.example.com` pointing at
//! it), and its host form is then `{port}-{id}.preview.example.com`; `*.localhost` keeps
//! working beside it.
//!
//! Requests carry the sandbox's preview token, not an API token: in the
//! `X-Tether-Preview-Token` header, in the `tether_preview_token` query parameter, or in a
//! cookie. A browser that opens a URL with the parameter is answered with the cookie and a
//! redirect to the same URL without it, so the token does not linger in the address bar;
//! any other client (curl, httpx, requests, urllib, fetch) is answered at once. Either way
//! the parameter never reaches the app. The token is HMAC-SHA256(agent token, id): per sandbox, stable for its life,
//! unguessable without the agent token, and needing no column in the store. It is
//! checked in constant time, and an unknown id, a missing token and a wrong one all get the
//! same 401 and the same body, so the answers tell nobody which sandbox ids exist.
//!
//! Each proxied request opens a session to the agent and a `connect` stream to the port,
//! and speaks HTTP/1.1 over it (hyper's client); a `101 Switching Protocols` answer
//! (WebSocket) then joins the two upgraded connections byte for byte.
//!
//! What reaches the app is the browser's request less the relay's credentials, which are never
//! the app's: the preview token (header, query parameter, cookie), `Proxy-Authorization` (the
//! app is no proxy), and an `Authorization` header that carries a relay credential: an API
//! token (`tether_...`, or any token the relay knows), the preview token, or either inside
//! `Basic` credentials. Any other `Authorization` is the app's own (its login, a bearer token
//! it issued) and passes untouched, so an app that does its own auth keeps working.
//!
//! The host form is the isolated one: each `{port}-{id}.localhost` is its own origin. In the
//! path form every sandbox shares the relay's origin, so a page from one sandbox could read
//! another's preview with the cookie the browser holds for it; use it only where the host
//! form cannot work.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::header::{self, HeaderName, HeaderValue};
use axum::http::{Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use hmac::{Hmac, Mac};
use hyper_util::rt::TokioIo;
use sha2::Sha256;
use tracing::debug;

use super::auth::hash_token;
use super::constants::API_TOKEN_PREFIX;
use super::error::ApiError;
use super::preview_domain::{PreviewDomain, LOCALHOST};
use super::state::{find, Relay};
use crate::caller::Caller;
use tether_client::api::{NetworkPolicy, PreviewInfo};
use tether_client::{files, Session};
use tether_relay_core::egress::explicit_proxy::EXPLICIT_PROXY_PORT;
use tether_store::{SandboxId, SandboxRecord};

/// The header that may carry the preview token.
const TOKEN_HEADER: &str = "x-tether-preview-token";
/// The query parameter that may carry it.
const TOKEN_PARAM: &str = "tether_preview_token";
/// The cookie that carries it once a browser has presented it.
const TOKEN_COOKIE: &str = "tether_preview";
/// Bytes of HMAC kept in a token (hex-encoded, so twice as many characters).
const TOKEN_BYTES: usize = 16;
/// Bytes buffered between hyper and the `connect` stream.
const PIPE_BYTES: usize = 256 << 10; // 256 KiB
/// What the HMAC signs besides the id, so the key serves no other purpose by accident.
const TOKEN_CONTEXT: &[u8] = b"tether-preview-v1:";

/// The preview routes, for the router to merge; [`by_host`] must also wrap the router (as
/// its outermost layer), since a host-form request may have any path.
pub(super) fn routes() -> Router<Arc<Relay>> {
    Router::new()
        .route("/v1/sandboxes/{id}/preview", get(info))
        .route("/preview/{id}/{port}", any(by_path))
        .route("/preview/{id}/{port}/", any(by_path))
        .route("/preview/{id}/{port}/{*rest}", any(by_path))
}

/// The preview token of `sandbox`.
pub(super) fn token(sandbox: &SandboxRecord) -> String {
    hex::encode(&mac(sandbox).finalize().into_bytes()[..TOKEN_BYTES])
}

fn mac(sandbox: &SandboxRecord) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(sandbox.agent_token.as_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(TOKEN_CONTEXT);
    mac.update(sandbox.id.as_str().as_bytes());
    mac
}

/// Whether `presented` is the sandbox's token, compared in constant time.
fn valid(sandbox: &SandboxRecord, presented: &str) -> bool {
    match hex::decode(presented) {
        Ok(bytes) if bytes.len() == TOKEN_BYTES => {
            mac(sandbox).verify_truncated_left(&bytes).is_ok()
        }
        _ => false,
    }
}

/// `GET /v1/sandboxes/{id}/preview`: the token and URL templates, for `tether info`.
pub(super) async fn info(
    State(relay): State<Arc<Relay>>,
    caller: Caller,
    Path(id): Path<String>,
    request_uri: Uri,
    headers: axum::http::HeaderMap,
) -> Result<Json<PreviewInfo>, ApiError> {
    let sandbox = find(&relay, &caller, id).await?;
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or(request_uri.authority().map(|a| a.as_str()))
        .unwrap_or("127.0.0.1")
        .to_string();
    let port = host
        .rsplit_once(':')
        .map(|(_, p)| format!(":{p}"))
        .unwrap_or_default();
    Ok(Json(PreviewInfo {
        token: token(&sandbox),
        host_url: format!(
            "{scheme}://{{port}}-{}.{domain}{port}/",
            sandbox.id,
            scheme = relay.scheme(),
            domain = relay
                .preview_domain
                .as_ref()
                .map_or(LOCALHOST, PreviewDomain::as_str),
        ),
        path_url: format!(
            "{scheme}://{host}/preview/{}/{{port}}/",
            sandbox.id,
            scheme = relay.scheme()
        ),
    }))
}

/// Middleware on every route: a request for `{port}-{id}.localhost` is a preview, whatever
/// its path; anything else goes on to the API.
pub(super) async fn by_host(State(relay): State<Arc<Relay>>, req: Request, next: Next) -> Response {
    let target = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| preview_host(h, relay.preview_domain.as_ref()));
    match target {
        Some((port, id)) => {
            proxy(
                &relay,
                Target {
                    id,
                    port,
                    prefix: None,
                },
                req,
            )
            .await
        }
        None => next.run(req).await,
    }
}

/// `/preview/{id}/{port}` and everything below it.
pub(super) async fn by_path(State(relay): State<Arc<Relay>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let mut parts = path.trim_start_matches('/').splitn(4, '/');
    let (_, id, port) = (
        parts.next(),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    let Ok(port) = port.parse::<u16>() else {
        return refuse(
            StatusCode::NOT_FOUND,
            "a preview path is /preview/{id}/{port}/...".into(),
        );
    };
    let prefix = format!("/preview/{id}/{port}");
    if path == prefix {
        // As a directory: relative links in the page must resolve below the prefix.
        let query = req
            .uri()
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        let location = format!("{prefix}/{query}");
        return (
            StatusCode::PERMANENT_REDIRECT,
            [(header::LOCATION, location)],
        )
            .into_response();
    }
    proxy(
        &relay,
        Target {
            id: id.to_string(),
            port,
            prefix: Some(prefix),
        },
        req,
    )
    .await
}

/// Where a preview request goes.
struct Target {
    id: String,
    port: u16,
    /// The path prefix to strip (path form).
    prefix: Option<String>,
}

/// `3000-sb-1a2b.localhost:7420` → (3000, `sb-1a2b`); likewise under the relay's preview
/// domain, when it has one. Host names are case-insensitive, so the name is lowercased first.
fn preview_host(host: &str, domain: Option<&PreviewDomain>) -> Option<(u16, String)> {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let name = name.to_ascii_lowercase();
    let label = name
        .strip_suffix(LOCALHOST)
        .and_then(|rest| rest.strip_suffix('.'))
        .or_else(|| {
            name.strip_suffix(domain?.as_str())
                .and_then(|rest| rest.strip_suffix('.'))
        })?;
    let (port, id) = label.split_once('-')?;
    let port = port.parse().ok()?;
    (!id.is_empty() && !id.contains('.')).then(|| (port, id.to_string()))
}

async fn proxy(relay: &Arc<Relay>, target: Target, req: Request) -> Response {
    match authorize_and_forward(relay, &target, req).await {
        Ok(response) => response,
        Err(response) => response,
    }
}

async fn authorize_and_forward(
    relay: &Arc<Relay>,
    target: &Target,
    mut req: Request,
) -> Result<Response, Response> {
    let sandbox = relay
        .store
        .get_any(&SandboxId::from(target.id.clone()))
        .await
        .map_err(|e| ApiError::from(e).into_response())?;
    let from_query = query_token(req.uri());
    let presented = header_token(&req).or(from_query.clone()).or_else(|| {
        let sandbox = sandbox.as_ref()?;
        cookie_tokens(&req).into_iter().find(|t| valid(sandbox, t))
    });
    // An unknown id, a missing token and a wrong one get the very same answer: the
    // response must not tell which sandbox ids exist.
    let sandbox = match (sandbox, presented) {
        (Some(sandbox), Some(t)) if valid(&sandbox, &t) => sandbox,
        _ => return Err(refuse(StatusCode::UNAUTHORIZED, DENIED.into())),
    };
    if relays_own_port(relay, &sandbox, target.port) {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            format!(
                "port {} of sandbox {} is its egress proxy, which is the relay's, not an app's: \
                 a preview never reaches it",
                target.port, sandbox.id
            ),
        ));
    }
    // `/preview/{id}/{port}` matches that path and everything below it, nothing beside it.
    let cookie_path = target.prefix.as_deref().unwrap_or("/");
    if from_query.is_some() && is_navigation(&req) {
        // Remember the token in a cookie and drop it from the URL. (A WebSocket cannot
        // follow a redirect: it is proxied at once, the parameter stripped.)
        let location = strip_token(req.uri(), None);
        // Under TLS the token must never be sent in clear text, to this host or any other.
        let secure = if relay.tls { "; Secure" } else { "" };
        let cookie = format!(
            "{TOKEN_COOKIE}={}; Path={cookie_path}; HttpOnly; SameSite=Lax{secure}",
            token(&sandbox)
        );
        return Ok((
            StatusCode::SEE_OTHER,
            [(header::LOCATION, location), (header::SET_COOKIE, cookie)],
        )
            .into_response());
    }

    let uri = strip_token(req.uri(), target.prefix.as_deref());
    *req.uri_mut() = uri.parse().map_err(|_| {
        refuse(
            StatusCode::BAD_REQUEST,
            "the request path is not valid".into(),
        )
    })?;
    scrub(&mut req, target);
    strip_relay_authorization(relay, &sandbox, req.headers_mut()).await;
    forward(relay, &sandbox, target, req).await
}

/// Whether `port` on the sandbox's loopback is the relay's own listener: the explicit egress
/// proxy the relay serves inside an allowlisted sandbox on its host. Through it a preview's
/// visitor would use the sandbox's allowlist and its secrets, which the preview token (handed
/// out to show an app) must never grant.
fn relays_own_port(relay: &Relay, sandbox: &SandboxRecord, port: u16) -> bool {
    port == EXPLICIT_PROXY_PORT
        && sandbox.spec.network == NetworkPolicy::Allowlist
        && relay
            .providers
            .get(sandbox.provider.as_str())
            .is_none_or(|p| p.host_bound())
}

/// Removes what belongs to the relay, not the app: the token header and cookie.
fn scrub(req: &mut Request, target: &Target) {
    let headers = req.headers_mut();
    headers.remove(TOKEN_HEADER);
    headers.remove(header::PROXY_AUTHORIZATION);
    let kept: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty() && c.split('=').next() != Some(TOKEN_COOKIE))
        .map(str::to_string)
        .collect();
    headers.remove(header::COOKIE);
    if let Ok(v) = HeaderValue::from_str(&kept.join("; ")) {
        if !kept.is_empty() {
            headers.insert(header::COOKIE, v);
        }
    }
    if let Some(prefix) = &target.prefix {
        if let Ok(v) = HeaderValue::from_str(prefix) {
            headers.insert(HeaderName::from_static("x-forwarded-prefix"), v);
        }
    }
}

/// Removes every `Authorization` value that carries a relay credential (see the module docs);
/// the app's own stay.
async fn strip_relay_authorization(
    relay: &Relay,
    sandbox: &SandboxRecord,
    headers: &mut axum::http::HeaderMap,
) {
    let values: Vec<HeaderValue> = headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .cloned()
        .collect();
    if values.is_empty() {
        return;
    }
    let mut kept = Vec::with_capacity(values.len());
    for value in values {
        let mut relays = false;
        for credential in credentials(value.as_bytes()) {
            if is_relay_credential(relay, sandbox, &credential).await {
                relays = true;
                break;
            }
        }
        if !relays {
            kept.push(value);
        }
    }
    headers.remove(header::AUTHORIZATION);
    for value in kept {
        headers.append(header::AUTHORIZATION, value);
    }
}

/// The credentials an `Authorization` value may carry: its token after the scheme, and for
/// `Basic`, the decoded user and password too.
fn credentials(value: &[u8]) -> Vec<String> {
    use base64::Engine as _;
    let text = String::from_utf8_lossy(value);
    let text = text.trim();
    let (scheme, rest) = text.split_once(' ').unwrap_or(("", text));
    let rest = rest.trim();
    let mut found = vec![rest.to_string()];
    if scheme.eq_ignore_ascii_case("basic") {
        if let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(rest) {
            let decoded = String::from_utf8_lossy(&decoded).into_owned();
            let (user, password) = decoded.split_once(':').unwrap_or((&decoded, ""));
            found.extend([user.to_string(), password.to_string()]);
        }
    }
    found.retain(|c| !c.is_empty());
    found
}

/// Whether `credential` is the relay's: an API token by its shape or by the relay's store, or
/// the sandbox's preview token.
async fn is_relay_credential(relay: &Relay, sandbox: &SandboxRecord, credential: &str) -> bool {
    if credential.starts_with(API_TOKEN_PREFIX) || valid(sandbox, credential) {
        return true;
    }
    // A token minted before API tokens had their prefix is known by its hash alone. A store
    // that cannot answer strips nothing more: the request goes on as the browser sent it.
    matches!(relay.store.token(hash_token(credential)).await, Ok(Some(_)))
}

/// Opens the way to the port and sends the request there.
async fn forward(
    relay: &Arc<Relay>,
    sandbox: &SandboxRecord,
    target: &Target,
    mut req: Request,
) -> Result<Response, Response> {
    let bad_gateway = |what: String| refuse(StatusCode::BAD_GATEWAY, what);
    let provider = relay
        .provider_of(sandbox)
        .map_err(IntoResponse::into_response)?;
    let guard = relay
        .tunnels
        .open(sandbox.id.clone())
        .map_err(|full| refuse(StatusCode::SERVICE_UNAVAILABLE, full.to_string()))?;
    relay.record_activity(&sandbox.id).await;
    let mut sandbox = sandbox.clone();
    relay
        .wake(&*provider, &mut sandbox)
        .await
        .map_err(IntoResponse::into_response)?;
    let sandbox = &sandbox;
    let agent = relay
        .connect_agent(&*provider, sandbox)
        .await
        .map_err(|e| {
            bad_gateway(format!(
                "cannot reach the agent of sandbox {}: {e}",
                sandbox.id
            ))
        })?;
    let session = Session::handshake(agent.into_websocket().await)
        .await
        .map_err(|e| {
            bad_gateway(format!(
                "the agent of sandbox {} did not answer: {e}",
                sandbox.id
            ))
        })?;
    let stream = session.connect_port(target.port).await.map_err(|e| {
        bad_gateway(format!(
            "cannot connect to port {} in sandbox {}: {e}",
            target.port, sandbox.id
        ))
    })?;
    let (near, far) = tokio::io::duplex(PIPE_BYTES);
    let (shutdown, task) = (relay.shutdown.clone(), relay.tasks.token());
    tokio::spawn(async move {
        // The session lives as long as the stream does; the guard counts it as activity,
        // and the task token makes the relay's shutdown wait for it (it ends it first).
        let _keep = (session, guard, task);
        tokio::select! {
            done = files::splice(stream, far) => {
                if let Err(e) = done {
                    debug!("preview connection ended: {e}");
                }
            }
            () = shutdown.cancelled() => {}
        }
    });
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(near))
        .await
        .map_err(|e| bad_gateway(format!("cannot speak HTTP to port {}: {e}", target.port)))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            debug!("preview HTTP connection ended: {e}");
        }
    });

    let client_upgrade = wants_upgrade(&req).then(|| hyper::upgrade::on(&mut req));
    let mut response = sender.send_request(req).await.map_err(|e| {
        bad_gateway(format!(
            "port {} in sandbox {} did not answer the request: {e}; is a server listening there?",
            target.port, sandbox.id
        ))
    })?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let app_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                let (Ok(client), Ok(app)) = (client_upgrade.await, app_upgrade.await) else {
                    return;
                };
                let (mut client, mut app) = (TokioIo::new(client), TokioIo::new(app));
                let _ = tokio::io::copy_bidirectional(&mut client, &mut app).await;
            });
        }
    }
    if let Some(prefix) = &target.prefix {
        rewrite_location(&mut response, prefix);
    }
    Ok(response.map(Body::new))
}

/// Whether `req` is a browser opening a page: it then gets the token as a cookie and a
/// redirect to the URL without it, so the token leaves the address bar. Every other client
/// (curl, httpx, requests, urllib, fetch, a WebSocket) is answered at once, the token
/// stripped: a redirect is not followed by all of them, and a cookie not kept by most.
fn is_navigation(req: &Request) -> bool {
    if !matches!(*req.method(), Method::GET | Method::HEAD) || wants_upgrade(req) {
        return false;
    }
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase)
    };
    match header("sec-fetch-mode") {
        // Browsers say what a request is for.
        Some(mode) => mode == "navigate",
        // Older ones do not, but ask for HTML first; programmatic clients ask for `*/*`.
        None => header("accept").is_some_and(|accept| accept.starts_with("text/html")),
    }
}

fn wants_upgrade(req: &Request) -> bool {
    req.headers()
        .get(header::CONNECTION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        })
}

/// A redirect to `/x` from an app behind a path prefix means `/preview/{id}/{port}/x`.
fn rewrite_location<B>(response: &mut axum::http::Response<B>, prefix: &str) {
    let Some(loc) = response
        .headers()
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
    else {
        return;
    };
    if loc.starts_with('/') && !loc.starts_with("//") && !loc.starts_with(prefix) {
        if let Ok(v) = HeaderValue::from_str(&format!("{prefix}{loc}")) {
            response.headers_mut().insert(header::LOCATION, v);
        }
    }
}

fn header_token(req: &Request) -> Option<String> {
    req.headers()
        .get(TOKEN_HEADER)?
        .to_str()
        .ok()
        .map(str::to_string)
}

fn query_token(uri: &Uri) -> Option<String> {
    let query = uri.query()?;
    serde_urlencoded::from_str::<Vec<(String, String)>>(query)
        .ok()?
        .into_iter()
        .find(|(k, _)| k == TOKEN_PARAM)
        .map(|(_, v)| v)
}

fn cookie_tokens(req: &Request) -> Vec<String> {
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .filter(|(name, _)| *name == TOKEN_COOKIE)
        .map(|(_, value)| value.to_string())
        .collect()
}

/// The path and query of `uri` without the token parameter, and without `prefix`.
fn strip_token(uri: &Uri, prefix: Option<&str>) -> String {
    let mut path = uri.path();
    if let Some(prefix) = prefix {
        path = path.strip_prefix(prefix).unwrap_or(path);
    }
    let path = if path.is_empty() { "/" } else { path };
    let query: Vec<&str> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty() && kv.split('=').next() != Some(TOKEN_PARAM))
        .collect();
    match query.is_empty() {
        true => path.to_string(),
        false => format!("{path}?{}", query.join("&")),
    }
}

/// Why a preview is refused: the same words whether the sandbox exists or not, and without
/// its id, so two refusals are identical to the byte.
const DENIED: &str = "no preview here without its token: open the URL `tether info ID` prints \
                      (it ends in ?tether_preview_token=...), or send the \
                      X-Tether-Preview-Token header; a deleted sandbox has no preview";

/// A plain-text refusal a person reading the browser tab understands.
fn refuse(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("tether preview: {message}\n"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preview_hosts_name_a_port_and_a_sandbox() {
        let host = |h| preview_host(h, None);
        assert_eq!(
            host("3000-sb-1a2b.localhost:7420"),
            Some((3000, "sb-1a2b".into()))
        );
        assert_eq!(host("80-sb-x.localhost"), Some((80, "sb-x".into())));
        assert_eq!(host("80-SB-X.LocalHost"), Some((80, "sb-x".into())));
        assert_eq!(host("127.0.0.1:7420"), None);
        assert_eq!(host("localhost:7420"), None);
        assert_eq!(host("x-sb-1.localhost"), None);
        assert_eq!(host("3000-a.b.localhost"), None);
        assert_eq!(host("3000-sb-1xlocalhost"), None);
        // No domain configured: a look-alike of one is no preview.
        assert_eq!(host("3000-sb-1.preview.example.com"), None);
    }

    #[test]
    fn a_preview_domain_adds_its_names_and_only_those() {
        let domain: PreviewDomain = "Preview.Example.com.".parse().unwrap();
        assert_eq!(domain.as_str(), "preview.example.com");
        let host = |h| preview_host(h, Some(&domain));
        assert_eq!(
            host("3000-sb-1a2b.preview.example.com"),
            Some((3000, "sb-1a2b".into()))
        );
        assert_eq!(
            host("3000-SB-1A2B.PREVIEW.example.com:443"),
            Some((3000, "sb-1a2b".into()))
        );
        assert_eq!(
            host("3000-sb-1.localhost:7420"),
            Some((3000, "sb-1".into()))
        );
        // Suffixes that are not the domain, names below another label, the domain itself.
        assert_eq!(host("3000-sb-1xpreview.example.com"), None);
        assert_eq!(host("3000-sb-1.preview.example.com.evil.net"), None);
        assert_eq!(host("3000-sb-1.evilpreview.example.com"), None);
        assert_eq!(host("3000-a.sb-1.preview.example.com"), None);
        assert_eq!(host("preview.example.com"), None);
        assert_eq!(host("example.com"), None);
    }

    #[test]
    fn preview_domains_that_cannot_work_are_refused_with_the_reason() {
        for (given, reason) in [
            ("", "empty"),
            ("preview", "one label"),
            ("*.preview.example.com", "not a DNS label"),
            ("preview..example.com", "not a DNS label"),
            ("-preview.example.com", "not a DNS label"),
            ("preview-.example.com", "not a DNS label"),
            ("préview.example.com", "not a DNS label"),
            ("preview.example.com:8080", "not a DNS label"),
            ("preview.example.com/x", "not a DNS label"),
            ("preview_1.example.com", "not a DNS label"),
            ("sandboxes.localhost", "localhost already"),
        ] {
            let err = given.parse::<PreviewDomain>().unwrap_err();
            assert!(err.contains(reason), "{given:?}: {err}");
            assert!(err.contains("wildcard record"), "{given:?}: {err}");
        }
        let long = format!("{}.example.com", "a.".repeat(100));
        assert!(long
            .parse::<PreviewDomain>()
            .unwrap_err()
            .contains("longer than"));
        let label = format!("{}.example.com", "a".repeat(64));
        assert!(label.parse::<PreviewDomain>().is_err());
        assert!("sb.preview-1.example.com".parse::<PreviewDomain>().is_ok());
    }

    #[test]
    fn tokens_leave_the_url_and_prefixes_go() {
        let uri: Uri = "/preview/sb-1/80/app?a=1&tether_preview_token=abc&b=2"
            .parse()
            .unwrap();
        assert_eq!(query_token(&uri).as_deref(), Some("abc"));
        assert_eq!(strip_token(&uri, Some("/preview/sb-1/80")), "/app?a=1&b=2");
        let uri: Uri = "/preview/sb-1/80?tether_preview_token=abc".parse().unwrap();
        assert_eq!(strip_token(&uri, Some("/preview/sb-1/80")), "/");
        assert_eq!(strip_token(&"/x".parse().unwrap(), None), "/x");
    }

    #[test]
    fn authorization_credentials_are_found_in_every_scheme() {
        use base64::Engine as _;
        assert_eq!(credentials(b"Bearer tether_abc"), ["tether_abc"]);
        let basic = base64::engine::general_purpose::STANDARD.encode("x:tether_abc");
        let found = credentials(format!("Basic {basic}").as_bytes());
        assert!(found.contains(&"tether_abc".to_string()), "{found:?}");
        assert_eq!(credentials(b"app-token-1"), ["app-token-1"]);
    }

    #[test]
    fn redirects_stay_under_the_prefix() {
        let mut r = axum::http::Response::builder()
            .header(header::LOCATION, "/login")
            .body(())
            .unwrap();
        rewrite_location(&mut r, "/preview/sb-1/80");
        assert_eq!(r.headers()[header::LOCATION], "/preview/sb-1/80/login");
    }
}
