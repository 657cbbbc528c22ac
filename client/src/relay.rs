//! The relay's REST API from the client side, and opening sessions through it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::api::{
    CreateRequest, Power, PreviewInfo, RenewRequest, SandboxInfo, SecretInfo, SecretRequest,
    SecretValue, TokenRequest, TokenResponse,
};

use super::session::Session;
use super::ClientError;

/// Where clients look for a relay when neither `--relay` nor `TETHER_RELAY` says.
pub const DEFAULT_RELAY: &str = "http://127.0.0.1:7420";

/// How long a REST call may take before it is reported as failed.
const HTTP_TIMEOUT: Duration = Duration::from_secs(120);

/// A client of one relay.
#[derive(Clone, Debug)]
pub struct RelayClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl RelayClient {
    /// A client of the relay at `base` (`http://host:port`), authenticating with `token`.
    pub fn new(base: &str, token: Option<String>) -> Result<RelayClient, ClientError> {
        let base = crate::local::check_relay_address(base).map_err(ClientError::Local)?;
        #[allow(unused_mut, reason = "only a build with TLS adds roots")]
        let mut builder = reqwest::Client::builder()
            .timeout(HTTP_TIMEOUT)
            .tcp_nodelay(true);
        #[cfg(feature = "rustls")]
        if base.starts_with("https://") {
            // The same roots as the WebSocket's: reqwest's webpki roots, plus TETHER_CA_CERT.
            for cert in &crate::tls::trust()?.extra {
                let cert = reqwest::Certificate::from_der(cert)
                    .map_err(|e| ClientError::Local(format!("cannot use a CA certificate: {e}")))?;
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder
            .build()
            .map_err(|e| ClientError::Local(e.to_string()))?;
        Ok(RelayClient { base, token, http })
    }

    /// A client configured from `TETHER_RELAY` and `TETHER_TOKEN`, falling back to the local
    /// relay and the admin token it wrote in its data directory.
    pub fn from_env() -> Result<RelayClient, ClientError> {
        RelayClient::new(&crate::local::relay_address(None), crate::local::token())
    }

    /// The relay's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Creates a sandbox (or, with `get_or_create`, finds the one with these labels).
    pub async fn create(&self, req: &CreateRequest) -> Result<SandboxInfo, ClientError> {
        self.send(self.http.post(self.url("/v1/sandboxes")).json(req))
            .await
    }

    /// One sandbox.
    pub async fn get(&self, id: &str) -> Result<SandboxInfo, ClientError> {
        self.send(self.http.get(self.url(&format!("/v1/sandboxes/{id}"))))
            .await
    }

    /// The tenant's sandboxes carrying all of `labels`.
    pub async fn list(
        &self,
        labels: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxInfo>, ClientError> {
        let query: Vec<(&str, String)> = labels
            .iter()
            .map(|(k, v)| ("label", format!("{k}={v}")))
            .collect();
        self.send(self.http.get(self.url("/v1/sandboxes")).query(&query))
            .await
    }

    /// Sandboxes at the relay's providers that carry Tether's label but are unknown to its
    /// registry (relay admin only).
    pub async fn orphans(&self) -> Result<crate::api::OrphanList, ClientError> {
        self.send(self.http.get(self.url("/v1/orphans"))).await
    }

    /// Deletes a sandbox and everything in it.
    pub async fn delete(&self, id: &str) -> Result<(), ClientError> {
        let resp = self
            .authed(self.http.delete(self.url(&format!("/v1/sandboxes/{id}"))))
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            let status = resp.status().as_u16();
            Err(ClientError::from_http(
                &self.base,
                status,
                &resp.text().await.unwrap_or_default(),
            ))
        }
    }

    /// Extends a sandbox's TTL to `ttl` from now.
    pub async fn renew(&self, id: &str, ttl: Duration) -> Result<SandboxInfo, ClientError> {
        let body = RenewRequest {
            ttl_secs: ttl.as_secs().max(1),
        };
        self.send(
            self.http
                .post(self.url(&format!("/v1/sandboxes/{id}/renew")))
                .json(&body),
        )
        .await
    }

    /// Pauses, resumes, stops or starts a sandbox (see [`Power`]); answers it in its new
    /// state. One already in the state asked for (or, to resume or start, not paused or
    /// stopped) is a 409 (`conflict`); a provider without the feature, a 501 (`unsupported`).
    pub async fn power(&self, id: &str, action: Power) -> Result<SandboxInfo, ClientError> {
        let path = format!("/v1/sandboxes/{id}/{}", action.as_str());
        self.send(self.http.post(self.url(&path))).await
    }

    /// Pauses a sandbox: its processes freeze with their memory kept, and attached sessions
    /// stay open.
    pub async fn pause(&self, id: &str) -> Result<SandboxInfo, ClientError> {
        self.power(id, Power::Pause).await
    }

    /// Resumes a paused sandbox where it was.
    pub async fn resume(&self, id: &str) -> Result<SandboxInfo, ClientError> {
        self.power(id, Power::Resume).await
    }

    /// Stops a sandbox: every process ends, its disk is kept.
    pub async fn stop(&self, id: &str) -> Result<SandboxInfo, ClientError> {
        self.power(id, Power::Stop).await
    }

    /// Starts a stopped sandbox again, its files as they were.
    pub async fn start(&self, id: &str) -> Result<SandboxInfo, ClientError> {
        self.power(id, Power::Start).await
    }

    /// How a browser reaches the sandbox's ports: its preview URLs and token.
    pub async fn preview(&self, id: &str) -> Result<PreviewInfo, ClientError> {
        self.send(
            self.http
                .get(self.url(&format!("/v1/sandboxes/{id}/preview"))),
        )
        .await
    }

    /// Mints a token for `tenant` (admin tokens only).
    pub async fn create_token(
        &self,
        tenant: &str,
        admin: bool,
    ) -> Result<TokenResponse, ClientError> {
        let body = TokenRequest {
            tenant: tenant.into(),
            admin,
        };
        self.send(self.http.post(self.url("/v1/tokens")).json(&body))
            .await
    }

    /// Stores secret `name` in the tenant's secret store (the caller's, or `tenant`'s for
    /// the relay's admin token), replacing any value it had.
    pub async fn set_secret(
        &self,
        name: &str,
        value: &SecretValue,
        tenant: Option<&str>,
    ) -> Result<SecretInfo, ClientError> {
        let body = SecretRequest {
            value: value.clone(),
        };
        let url = self.secret_url(Some(name))?;
        self.send(self.http.put(url).query(&tenant_query(tenant)).json(&body))
            .await
    }

    /// The secrets in the tenant's store (the caller's, or `tenant`'s for the relay's admin
    /// token): names and times, never values.
    pub async fn secrets(&self, tenant: Option<&str>) -> Result<Vec<SecretInfo>, ClientError> {
        let url = self.secret_url(None)?;
        self.send(self.http.get(url).query(&tenant_query(tenant)))
            .await
    }

    /// Deletes secret `name` from the tenant's store; a name it does not hold is a 404.
    pub async fn delete_secret(&self, name: &str, tenant: Option<&str>) -> Result<(), ClientError> {
        let url = self.secret_url(Some(name))?;
        let req = self.http.delete(url).query(&tenant_query(tenant));
        let resp = self
            .authed(req)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let status = resp.status().as_u16();
        if resp.status().is_success() {
            return Ok(());
        }
        Err(ClientError::from_http(
            &self.base,
            status,
            &resp.text().await.unwrap_or_default(),
        ))
    }

    /// `/v1/secrets`, or `/v1/secrets/{name}` with the name percent-encoded, so a name that
    /// is no valid one reaches the relay as one segment and is refused for what it is.
    fn secret_url(&self, name: Option<&str>) -> Result<reqwest::Url, ClientError> {
        let bad = |e: String| ClientError::Local(format!("cannot build a relay URL: {e}"));
        let mut url =
            reqwest::Url::parse(&self.url("/v1/secrets")).map_err(|e| bad(e.to_string()))?;
        if let Some(name) = name {
            url.path_segments_mut()
                .map_err(|()| bad(format!("{} cannot take a path", self.base)))?
                .push(name);
        }
        Ok(url)
    }

    /// Opens a protocol session to a sandbox's agent through the relay.
    pub async fn connect(&self, id: &str) -> Result<Session, ClientError> {
        let ws = format!(
            "{}/v1/sandboxes/{id}/ws",
            self.base.replacen("http", "ws", 1)
        );
        Session::connect(&ws, self.token.as_deref()).await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// The error for a request that got no whole answer: the relay could not be reached
    /// ([`ClientError::Connect`], nothing was asked of it), or it was, and the connection
    /// ended before its answer did ([`ClientError::Interrupted`], it may have acted).
    fn unreachable(&self, e: reqwest::Error) -> ClientError {
        #[cfg(feature = "rustls")]
        if let Some(tls) = crate::tls::explain(&self.base, &e) {
            return tls;
        }
        if !e.is_connect() && (e.is_request() || e.is_timeout() || e.is_body() || e.is_decode()) {
            return ClientError::Interrupted {
                url: self.base.clone(),
                reason: cause_chain(&e),
            };
        }
        ClientError::Connect {
            url: self.base.clone(),
            reason: cause_chain(&e),
        }
    }

    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        let resp = self
            .authed(req)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let status = resp.status().as_u16();
        let body = resp.text().await.map_err(|e| self.unreachable(e))?;
        if !(200..300).contains(&status) {
            return Err(ClientError::from_http(&self.base, status, &body));
        }
        serde_json::from_str(&body).map_err(|e| ClientError::from_unexpected(&self.base, &body, &e))
    }
}

/// `e` and its causes, innermost last: reqwest's own sentence ("error sending request")
/// names no cause, which is what tells a cut connection from a timeout.
fn cause_chain(e: &reqwest::Error) -> String {
    let mut said = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        said.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    said
}

/// The `?tenant=T` of the secret routes, when a tenant is named.
fn tenant_query(tenant: Option<&str>) -> Vec<(&'static str, &str)> {
    tenant.map(|t| ("tenant", t)).into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A relay that is not there, and one that takes the request and dies before it answers,
    /// are told apart at the client: only the second may have acted.
    #[tokio::test]
    async fn a_relay_gone_mid_request_is_not_a_relay_that_is_not_there() {
        // Accepts one connection, reads the request's head, and closes without a word.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = vec![0; 4096];
            let _ = conn.read(&mut head).await.unwrap();
            drop(conn);
        });
        let client = RelayClient::new(&format!("http://{addr}"), None).unwrap();
        let err = client.create(&CreateRequest::default()).await.unwrap_err();
        cut.await.unwrap();
        assert!(
            matches!(err, ClientError::Interrupted { .. }),
            "a cut request: {err:?}"
        );
        let said = err.to_string();
        assert!(said.contains("may exist"), "{said}");
        // Advice that names a command is the CLI's to give, not a library's.
        assert!(!said.contains("tether "), "{said}");

        // Nobody listens there any more: refused, nothing was asked.
        let err = client.create(&CreateRequest::default()).await.unwrap_err();
        assert!(
            matches!(err, ClientError::Connect { .. }),
            "refused: {err:?}"
        );
        assert!(!err.to_string().contains("tether "), "{err}");
    }
}
