//! `tether mcp --listen ADDR`: the MCP server over streamable HTTP at `/mcp`, behind a
//! bearer token compared in constant time. The token comes from `--token-file`, else from
//! `TETHER_MCP_TOKEN`, else one is generated and written (mode 0600) to `mcp.token` in the
//! relay's data directory, whose path is printed.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use tether_client::local::{self, data_dir as default_data_dir};

use super::constants::{HTTP_PATH, TOKEN_FILE};
use super::tools::Tools;
use super::Server;

/// The token's environment variable.
pub(super) const TOKEN_ENV: &str = "TETHER_MCP_TOKEN";

/// The token HTTP clients must present, and where it came from (for the startup line).
pub(super) fn resolve_token(file: Option<&Path>) -> anyhow::Result<(String, String)> {
    if let Some(file) = file {
        let token = std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("--token-file {}: {e}", file.display()))?
            .trim()
            .to_string();
        check_token(&token, &file.display().to_string())?;
        return Ok((token, format!("from {}", file.display())));
    }
    if let Ok(token) = std::env::var(TOKEN_ENV) {
        let token = token.trim().to_string();
        check_token(&token, TOKEN_ENV)?;
        return Ok((token, format!("from {TOKEN_ENV}")));
    }
    let path = default_data_dir().join(TOKEN_FILE);
    let token = hex::encode(rand::random::<[u8; 32]>());
    write_private(&path, &token)?;
    Ok((token, format!("generated, in {}", path.display())))
}

fn check_token(token: &str, source: &str) -> anyhow::Result<()> {
    if token.len() < 16 {
        anyhow::bail!(
            "the MCP token in {source} is shorter than 16 characters; use a long random one \
             (e.g. `openssl rand -hex 32`)"
        );
    }
    Ok(())
}

fn write_private(path: &Path, token: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    local::write_private(path, token)
        .map_err(|e| anyhow::anyhow!("cannot write the MCP token to {}: {e}", path.display()))
}

/// Serves until `stop` is cancelled.
pub(super) async fn serve(
    server: Arc<Server>,
    listen: SocketAddr,
    token: String,
    token_source: &str,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut config =
        StreamableHttpServerConfig::default().with_cancellation_token(stop.child_token());
    if !listen.ip().is_loopback() {
        // Reached by other names than localhost: the token, not the Host header, is what
        // keeps strangers out (DNS rebinding needs a browser that knows the token).
        config = config.disable_allowed_hosts();
    }
    let service = StreamableHttpService::new(
        move || Ok(Tools::new(server.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let expected: Arc<[u8; 32]> = Arc::new(Sha256::digest(token.as_bytes()).into());
    let app = axum::Router::new()
        .nest_service(HTTP_PATH, service)
        .layer(axum::middleware::from_fn_with_state(expected, authenticate));
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    let addr = listener.local_addr()?;
    // Tests and scripts read this line to learn the port of `--listen 127.0.0.1:0`.
    eprintln!("tether mcp: listening on http://{addr}{HTTP_PATH} (bearer token {token_source})");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled_owned().await })
        .await?;
    Ok(())
}

/// Lets through only requests carrying `Authorization: Bearer <token>`. Digests are
/// compared, in constant time, so neither the bytes nor the length of the token leak.
async fn authenticate(State(expected): State<Arc<[u8; 32]>>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| Sha256::digest(t.trim().as_bytes()));
    match presented {
        Some(digest) if bool::from(digest.as_slice().ct_eq(expected.as_slice())) => {
            next.run(req).await
        }
        // The request's body is never read, so the connection cannot carry another request:
        // say so, or a client reusing it races the server closing it.
        _ => (
            StatusCode::UNAUTHORIZED,
            [
                (header::WWW_AUTHENTICATE, "Bearer"),
                (header::CONNECTION, "close"),
            ],
            axum::Json(serde_json::json!({
                "error": {
                    "code": "unauthorized",
                    "message": "missing or wrong bearer token: send `Authorization: Bearer \
                                <token>` with the token `tether mcp` was started with",
                }
            })),
        )
            .into_response(),
    }
}
