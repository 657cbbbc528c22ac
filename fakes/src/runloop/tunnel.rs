//! The fake's V2 tunnels: a request whose `Host` is `{port}-{tunnel_key}.tunnel.{anything}`
//! goes to that port of the tunnel's devbox, as Runloop's `https://{port}-{tunnel_key}.tunnel.
//! runloop.ai` does. An authenticated tunnel demands `X-Runloop-Tunnel-Authorization: Bearer
//! {auth_token}` (401 without it) and strips it; a suspended devbox is resumed first when its
//! tunnel has `wake_on_http` (or its launch parameters `resume_triggers.http`), else refused
//! (503); traffic through a tunnel with `http_keep_alive` counts as activity for the idle
//! timer. What it cannot reach is answered 502.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::devboxes::{by_tunnel, resume_now, tunnel_authorized};
use super::{error, Runloop};
use crate::edge::{self, ProxyError};

/// The longest a woken devbox may take to run again.
const WAKE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a waking devbox is looked at.
const WAKE_POLL: Duration = Duration::from_millis(50);

/// A tunnel request's target.
pub(super) struct Route {
    port: u16,
    key: String,
}

/// The tunnel a request is for, from its `Host`.
pub(super) fn route(headers: &HeaderMap) -> Option<Route> {
    let host = headers.get("host")?.to_str().ok()?;
    let (label, rest) = host.split_once('.')?;
    if !rest.starts_with("tunnel.") {
        return None;
    }
    let (port, key) = label.split_once('-')?;
    Some(Route {
        port: port.parse().ok()?,
        key: key.to_string(),
    })
}

/// Carries `req` through the tunnel.
pub(super) async fn serve(fake: &Arc<Runloop>, route: Route, mut req: Request) -> Response {
    let Some(devbox) = by_tunnel(fake, &route.key) else {
        return error(StatusCode::NOT_FOUND, "tunnel not found");
    };
    let Some(tunnel) = devbox.tunnel.clone() else {
        return error(StatusCode::NOT_FOUND, "tunnel not found");
    };
    if !tunnel_authorized(&tunnel, req.headers()) {
        return error(
            StatusCode::UNAUTHORIZED,
            "missing or invalid tunnel authorization",
        );
    }
    req.headers_mut().remove("x-runloop-tunnel-authorization");
    let wake = tunnel.wake_on_http || devbox_wakes_on_http(fake, &devbox.id);
    match devbox.status {
        "running" => {}
        "suspended" | "suspending" | "resuming" if wake => {
            if devbox.status == "suspended" {
                resume_now(fake, &devbox.id);
            }
            let deadline = Instant::now() + WAKE_TIMEOUT;
            loop {
                let status = by_tunnel(fake, &route.key).map(|d| d.status);
                match status {
                    Some("running") => break,
                    Some("suspended" | "suspending" | "resuming" | "initializing")
                        if Instant::now() < deadline => {}
                    _ => return error(StatusCode::BAD_GATEWAY, "the devbox did not wake"),
                }
                tokio::time::sleep(WAKE_POLL).await;
            }
        }
        status => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("devbox {} is {status}", devbox.id),
            )
        }
    }
    if tunnel.http_keep_alive {
        fake.touch(&devbox.id);
    }
    match edge::proxy(&fake.sandboxes, &devbox.id, route.port, req).await {
        Ok(resp) => resp,
        Err(ProxyError::Dial(e)) => error(StatusCode::BAD_GATEWAY, &e.to_string()),
        Err(e) => error(StatusCode::BAD_GATEWAY, &e.to_string()),
    }
}

/// `launch_parameters.lifecycle.resume_triggers.http`.
fn devbox_wakes_on_http(fake: &Runloop, id: &str) -> bool {
    fake.devboxes
        .lock()
        .expect("devboxes")
        .get(id)
        .and_then(|d| d.wakes_on_http())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tunnels_are_routed_by_host() {
        let mut headers = HeaderMap::new();
        headers.insert("host", "7421-abc123.tunnel.runloop.ai".parse().unwrap());
        let r = route(&headers).unwrap();
        assert_eq!((r.port, r.key.as_str()), (7421, "abc123"));
        headers.insert("host", "8000-k.tunnel.127.0.0.1:9000".parse().unwrap());
        assert_eq!(route(&headers).unwrap().port, 8000);
        for other in [
            "127.0.0.1:9000",
            "api.runloop.ai",
            "x-y.example.com",
            "70000-k.tunnel.a",
        ] {
            headers.insert("host", other.parse().unwrap());
            assert!(route(&headers).is_none(), "{other}");
        }
    }
}
