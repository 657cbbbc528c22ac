//! A provider's control plane over HTTPS and JSON: every call authenticated, passing failures
//! retried (see [`super::retry`]), and every failure turned into an error that says what
//! happened and, for a refused key, which variable to fix.

use anyhow::anyhow;
use bytes::Bytes;
use reqwest::header::{HeaderName, HeaderValue};
use reqwest::Method;
use serde::de::DeserializeOwned;

use super::constants::{CONNECT_TIMEOUT, MAX_QUOTED_BODY, REQUEST_TIMEOUT};
use super::retry::{self, Backoff};
use tether_relay_core::provider::ProviderError;

/// The HTTP client the cloud providers use, for control planes and edges alike. Redirects are
/// not followed: a provider's edge answers a refused token with one (Daytona's 307).
pub(crate) fn client() -> Result<reqwest::Client, ProviderError> {
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| ProviderError::Unavailable(format!("cannot set up an HTTP client: {e}")))
}

/// One provider's REST API.
#[derive(Clone, Debug)]
pub(crate) struct ControlPlane {
    http: reqwest::Client,
    base: String,
    auth: (HeaderName, HeaderValue),
    provider: &'static str,
    key_var: &'static str,
}

/// A successful answer.
#[derive(Debug)]
pub(crate) struct Answer {
    /// Its status (2xx): some calls tell outcomes apart by it (E2B's connect answers 201
    /// when it resumed the sandbox, 200 when it was running).
    pub status: u16,
    /// Its body.
    pub body: Bytes,
    /// Its headers (a list's next-page token, for one).
    pub headers: reqwest::header::HeaderMap,
}

impl Answer {
    /// The body as `T`.
    pub(crate) fn json<T: DeserializeOwned>(&self, what: &str) -> Result<T, ProviderError> {
        serde_json::from_slice(&self.body).map_err(|e| {
            ProviderError::Other(anyhow!(
                "unexpected answer to {what}: {e} (body: {})",
                quote(&self.body)
            ))
        })
    }
}

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// The provider answered with an error status.
    #[error("{provider} answered {what} with HTTP {status}{after}: {message}")]
    Status {
        /// Which provider.
        provider: &'static str,
        /// What we asked for.
        what: String,
        /// The status.
        status: u16,
        /// The provider's message (or the body).
        message: String,
        /// ` after N tries` when retried.
        after: String,
        /// Whether the body was a JSON object: the API's own error, not a proxy's page.
        from_api: bool,
        /// The variable holding the key, for a refused one.
        key_var: &'static str,
    },
    /// The provider could not be reached, or the connection broke.
    #[error("cannot reach {provider} for {what} at {url}: {source}")]
    Network {
        /// Which provider.
        provider: &'static str,
        /// What we asked for.
        what: String,
        /// Where.
        url: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
}

impl CallError {
    /// Whether the provider's API itself said the thing asked about does not exist: a 404
    /// carrying the API's JSON error. A 404 from anything else in the way (a proxy, a wrong
    /// base URL) proves nothing about a sandbox, so it must never make one gone.
    pub(crate) fn is_not_found(&self) -> bool {
        matches!(
            self,
            CallError::Status {
                status: 404,
                from_api: true,
                ..
            }
        )
    }

    /// The HTTP status, for errors the provider answered.
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            CallError::Status { status, .. } => Some(*status),
            CallError::Network { .. } => None,
        }
    }
}

impl From<CallError> for ProviderError {
    fn from(e: CallError) -> ProviderError {
        match &e {
            CallError::Status {
                status: status @ (401 | 403),
                provider,
                key_var,
                message,
                ..
            } => ProviderError::Auth(format!(
                "{provider} refused the credentials in {key_var} (HTTP {status}: {message}); \
                     set {key_var} to a valid key and restart the relay"
            )),
            _ => ProviderError::Other(anyhow!(e)),
        }
    }
}

impl ControlPlane {
    /// The API at `base` (no trailing slash), authenticated by header `auth`; `key_var` names
    /// the variable that holds the key, for messages.
    pub(crate) fn new(
        http: reqwest::Client,
        provider: &'static str,
        base: &str,
        auth: (&'static str, &str),
        key_var: &'static str,
    ) -> Result<ControlPlane, ProviderError> {
        let value = HeaderValue::from_str(auth.1).map_err(|_| {
            ProviderError::Auth(format!(
                "{key_var} holds characters that cannot be sent in an HTTP header; set it to the \
                 key exactly as {provider} shows it"
            ))
        })?;
        Ok(ControlPlane {
            http,
            base: base.trim_end_matches('/').to_string(),
            auth: (HeaderName::from_static(auth.0), value),
            provider,
            key_var,
        })
    }

    /// The shared HTTP client.
    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// `method path` with an optional JSON body, retried while the failure is passing.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        what: &str,
    ) -> Result<Answer, CallError> {
        self.call_with(method, path, body, &[], what).await
    }

    /// Like [`ControlPlane::call`], with extra headers.
    pub(crate) async fn call_with(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        headers: &[(&'static str, String)],
        what: &str,
    ) -> Result<Answer, CallError> {
        let url = format!("{}{path}", self.base);
        let mut backoff = Backoff::new();
        loop {
            let mut req = self
                .http
                .request(method.clone(), &url)
                .timeout(REQUEST_TIMEOUT)
                .header(self.auth.0.clone(), self.auth.1.clone());
            for (name, value) in headers {
                req = req.header(*name, value);
            }
            if let Some(body) = body {
                req = req.json(body);
            }
            let (status, wait_hint, auth_block, answer_headers, bytes) = match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let hint = retry::retry_after(resp.headers());
                    let auth_block = status == 429 && retry::is_failed_auth_block(resp.headers());
                    let answer_headers = resp.headers().clone();
                    let bytes = resp
                        .bytes()
                        .await
                        .map_err(|source| self.network(what, &url, source))?;
                    (status, hint, auth_block, answer_headers, bytes)
                }
                // Nothing was sent: trying again cannot do anything twice.
                Err(e) if e.is_connect() => match backoff.next(None) {
                    Some(wait) => {
                        tracing::debug!(
                            "{}: cannot connect for {what} ({e}); retrying in {wait:?}",
                            self.provider
                        );
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    None => return Err(self.network(what, &url, e)),
                },
                Err(e) => return Err(self.network(what, &url, e)),
            };
            if (200..300).contains(&status) {
                return Ok(Answer {
                    status,
                    body: bytes,
                    headers: answer_headers,
                });
            }
            if retry::is_retryable(status) && !auth_block {
                if let Some(wait) = backoff.next(wait_hint) {
                    tracing::debug!(
                        "{}: HTTP {status} for {what}; retrying in {wait:?}",
                        self.provider
                    );
                    tokio::time::sleep(wait).await;
                    continue;
                }
            }
            let tries = backoff.tries();
            let mut message = message_of(&bytes);
            if auth_block {
                message.push_str(&format!(
                    "; {} blocks this IP for a while after repeated refused credentials (its \
                     failed-auth limiter): check {} and anything else here using a wrong key, \
                     then try again later",
                    self.provider, self.key_var
                ));
            }
            return Err(CallError::Status {
                provider: self.provider,
                what: what.to_string(),
                status,
                message,
                from_api: serde_json::from_slice::<serde_json::Value>(&bytes)
                    .is_ok_and(|v| v.is_object()),
                after: if tries > 1 {
                    format!(" after {tries} tries")
                } else {
                    String::new()
                },
                key_var: self.key_var,
            });
        }
    }

    fn network(&self, what: &str, url: &str, source: reqwest::Error) -> CallError {
        CallError::Network {
            provider: self.provider,
            what: what.to_string(),
            url: url.to_string(),
            source,
        }
    }
}

/// The human part of an error body: its `message` (a string, or a list of them as NestJS
/// sends), else the body itself, shortened.
pub(crate) fn message_of(body: &[u8]) -> String {
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(body) {
        match json.get("message") {
            Some(serde_json::Value::String(s)) => return s.clone(),
            Some(serde_json::Value::Array(items)) => {
                let parts: Vec<String> = items
                    .iter()
                    .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_string))
                    .collect();
                return parts.join(", ");
            }
            _ => {}
        }
    }
    if body.is_empty() {
        "(no body)".to_string()
    } else {
        quote(body)
    }
}

/// `body` as text, at most [`MAX_QUOTED_BODY`] bytes of it.
pub(crate) fn quote(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.len() <= MAX_QUOTED_BODY {
        return text.to_string();
    }
    let mut cut = MAX_QUOTED_BODY;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_come_from_the_body() {
        assert_eq!(
            message_of(br#"{"code":429,"message":"Rate limit exceeded"}"#),
            "Rate limit exceeded"
        );
        assert_eq!(
            message_of(br#"{"statusCode":400,"message":["a","b"]}"#),
            "a, b"
        );
        assert_eq!(message_of(b"plain"), "plain");
        assert_eq!(message_of(b""), "(no body)");
        assert!(quote(&[b'x'; 1000]).ends_with('…'));
    }

    #[tokio::test]
    async fn only_the_apis_own_404_says_not_found() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        // The API's JSON 404 for the first request, a proxy's HTML 404 for the second.
        tokio::spawn(async move {
            let bodies = [
                (
                    "application/json",
                    r#"{"code":404,"message":"sandbox \"x\" not found"}"#,
                ),
                ("text/html", "<html><body>404 Not Found</body></html>"),
            ];
            for (kind, body) in bodies {
                let (mut tcp, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 4096];
                let _ = tcp.read(&mut buf).await.unwrap();
                let reply = format!(
                    "HTTP/1.1 404 Not Found\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{body}",
                    body.len()
                );
                tcp.write_all(reply.as_bytes()).await.unwrap();
            }
        });
        let api =
            ControlPlane::new(client().unwrap(), "test", &base, ("x-api-key", "k"), "KEY").unwrap();
        let api_404 = api
            .call(Method::GET, "/sandboxes/x", None, "a lookup")
            .await;
        assert!(api_404.unwrap_err().is_not_found());
        let proxy_404 = api
            .call(Method::GET, "/sandboxes/x", None, "a lookup")
            .await;
        let proxy_404 = proxy_404.unwrap_err();
        assert_eq!(proxy_404.status(), Some(404));
        assert!(!proxy_404.is_not_found());
    }
}
