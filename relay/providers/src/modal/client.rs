//! Modal's control plane over gRPC (`modal.client.ModalClient`, HTTP/2, TLS): the channel,
//! the headers every call carries (token id and secret, client type and version, and the
//! short-lived auth token from `AuthTokenGet`), retries of passing failures, and the map from
//! gRPC status codes to [`ProviderError`].

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use tokio::sync::Mutex;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Status};

use super::pb::modal_client_client::ModalClientClient;
use super::pb::AuthTokenGetRequest;
use crate::cloud::constants::{CONNECT_TIMEOUT, REQUEST_TIMEOUT};
use crate::cloud::retry::Backoff;
use tether_relay_core::provider::ProviderError;

/// `x-modal-client-type`: Modal has no value for third-party clients; this is the one its
/// own Go SDK (libmodal) sends, whose API surface (sandboxes only) we match.
const CLIENT_TYPE: &str = "9";
/// `x-modal-client-version`: the Python SDK version whose behaviour we follow, as libmodal
/// sends it.
const CLIENT_VERSION: &str = "1.0.0";
/// Refresh the auth token this long before Modal said it expires.
const AUTH_TOKEN_MARGIN: Duration = Duration::from_secs(60);
/// An auth token whose expiry cannot be read is refreshed after this long.
const AUTH_TOKEN_FALLBACK: Duration = Duration::from_secs(300);
/// HTTP/2 keepalive pings on the channel: idle connections die silently otherwise.
const KEEPALIVE: Duration = Duration::from_secs(30);

/// A session with Modal's API.
pub(super) struct Modal {
    client: ModalClientClient<Channel>,
    token_id: MetadataValue<tonic::metadata::Ascii>,
    token_secret: MetadataValue<tonic::metadata::Ascii>,
    auth: Mutex<Option<(MetadataValue<tonic::metadata::Ascii>, Instant)>>,
}

impl std::fmt::Debug for Modal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Modal").finish_non_exhaustive()
    }
}

impl Modal {
    /// A lazily connected session with the server at `url` (`https://api.modal.com`).
    pub(super) fn new(
        url: &str,
        token_id: &str,
        token_secret: &str,
    ) -> Result<Modal, ProviderError> {
        let bad = |var: &str| {
            ProviderError::Auth(format!(
                "{var} holds characters that cannot be sent in a header; set it as Modal shows it"
            ))
        };
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| {
                ProviderError::Unavailable(format!("MODAL_SERVER_URL {url} is not a URL: {e}"))
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_while_idle(true);
        if url.starts_with("https://") {
            endpoint = endpoint
                .tls_config(ClientTlsConfig::new().with_webpki_roots())
                .map_err(|e| {
                    ProviderError::Unavailable(format!("cannot set up TLS for Modal: {e}"))
                })?;
        }
        Ok(Modal {
            client: ModalClientClient::new(endpoint.connect_lazy()),
            token_id: token_id.parse().map_err(|_| bad("MODAL_TOKEN_ID"))?,
            token_secret: token_secret
                .parse()
                .map_err(|_| bad("MODAL_TOKEN_SECRET"))?,
            auth: Mutex::new(None),
        })
    }

    /// The gRPC client.
    pub(super) fn client(&self) -> ModalClientClient<Channel> {
        self.client.clone()
    }

    fn identify(&self, metadata: &mut MetadataMap) {
        metadata.insert("x-modal-token-id", self.token_id.clone());
        metadata.insert("x-modal-token-secret", self.token_secret.clone());
        metadata.insert(
            "x-modal-client-type",
            MetadataValue::from_static(CLIENT_TYPE),
        );
        metadata.insert(
            "x-modal-client-version",
            MetadataValue::from_static(CLIENT_VERSION),
        );
    }

    /// The current auth token, fetched again when it is about to expire.
    async fn auth_token(&self) -> Result<MetadataValue<tonic::metadata::Ascii>, ProviderError> {
        let mut cached = self.auth.lock().await;
        if let Some((token, refresh_at)) = cached.as_ref() {
            if Instant::now() < *refresh_at {
                return Ok(token.clone());
            }
        }
        let mut backoff = Backoff::new();
        let answer = loop {
            let mut req = Request::new(AuthTokenGetRequest {});
            self.identify(req.metadata_mut());
            match self.client().auth_token_get(req).await {
                Ok(answer) => break answer.into_inner(),
                Err(status) => match passing(&status).then(|| backoff.next(None)).flatten() {
                    Some(wait) => tokio::time::sleep(wait).await,
                    None => return Err(to_provider_error("AuthTokenGet", status, backoff.tries())),
                },
            }
        };
        let refresh_in = jwt_lifetime(&answer.token)
            .map(|life| life.saturating_sub(AUTH_TOKEN_MARGIN))
            .unwrap_or(AUTH_TOKEN_FALLBACK);
        let token: MetadataValue<_> = answer.token.parse().map_err(|_| {
            ProviderError::Other(anyhow!(
                "Modal sent an auth token that is not a valid header"
            ))
        })?;
        *cached = Some((token.clone(), Instant::now() + refresh_in));
        Ok(token)
    }

    /// Calls `rpc` (named `what` in errors) with `message`, retrying passing failures. Every
    /// try of one call carries the same `x-idempotency-key`.
    pub(super) async fn call<M, T, F, Fut>(
        &self,
        what: &str,
        message: M,
        rpc: F,
    ) -> Result<T, CallError>
    where
        M: Clone,
        F: Fn(ModalClientClient<Channel>, Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let auth = self.auth_token().await.map_err(CallError::Provider)?;
        let key = idempotency_key();
        let mut backoff = Backoff::new();
        loop {
            let mut req = Request::new(message.clone());
            self.identify(req.metadata_mut());
            req.metadata_mut()
                .insert("x-modal-auth-token", auth.clone());
            req.metadata_mut().insert("x-idempotency-key", key.clone());
            let attempt = (backoff.tries() - 1).to_string();
            req.metadata_mut()
                .insert("x-retry-attempt", attempt.parse().expect("digits"));
            match rpc(self.client(), req).await {
                Ok(answer) => return Ok(answer.into_inner()),
                Err(status) => match passing(&status).then(|| backoff.next(None)).flatten() {
                    Some(wait) => {
                        tracing::debug!(
                            "Modal {what}: {} ({}); retrying in {wait:?}",
                            status.code(),
                            status.message()
                        );
                        tokio::time::sleep(wait).await;
                    }
                    None => {
                        return Err(CallError::Grpc {
                            what: what.to_string(),
                            status,
                            tries: backoff.tries(),
                        })
                    }
                },
            }
        }
    }
}

/// A failed call: a gRPC status (kept for callers that handle `NOT_FOUND` or
/// `ALREADY_EXISTS`), or an error getting there.
#[derive(Debug)]
pub(super) enum CallError {
    /// Modal answered with this status.
    Grpc {
        /// The RPC.
        what: String,
        /// Its status.
        status: Status,
        /// Tries made.
        tries: u32,
    },
    /// No call was made.
    Provider(ProviderError),
}

impl CallError {
    /// The gRPC code, if Modal answered.
    pub(super) fn code(&self) -> Option<Code> {
        match self {
            CallError::Grpc { status, .. } => Some(status.code()),
            CallError::Provider(_) => None,
        }
    }
}

impl From<CallError> for ProviderError {
    fn from(e: CallError) -> ProviderError {
        match e {
            CallError::Grpc {
                what,
                status,
                tries,
            } => to_provider_error(&what, status, tries),
            CallError::Provider(e) => e,
        }
    }
}

/// Failures worth another try: Modal is busy or unreachable. Not `RESOURCE_EXHAUSTED`, which
/// the SDK does not retry either: a message over gRPC's size limit or a quota, which the same
/// call meets again.
fn passing(status: &Status) -> bool {
    matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded)
}

fn to_provider_error(what: &str, status: Status, tries: u32) -> ProviderError {
    let after = if tries > 1 {
        format!(" after {tries} tries")
    } else {
        String::new()
    };
    let message = status.message();
    match status.code() {
        Code::Unauthenticated | Code::PermissionDenied => ProviderError::Auth(format!(
            "Modal refused the token in MODAL_TOKEN_ID and MODAL_TOKEN_SECRET ({:?}: {message}); set \
             both to a valid token (`modal token new`) and restart the relay",
            status.code()
        )),
        Code::InvalidArgument | Code::FailedPrecondition => {
            ProviderError::InvalidSpec(format!("Modal refused {what}: {message}"))
        }
        Code::ResourceExhausted => ProviderError::Other(anyhow!(
            "Modal refused {what} with ResourceExhausted: {message} (a limit, such as a message \
             over 4 MiB or a quota of your workspace; not retried, since the same call would \
             meet it again)"
        )),
        code => ProviderError::Other(anyhow!("Modal answered {what} with {code:?}{after}: {message}")),
    }
}

/// A random idempotency key (a UUIDv4).
fn idempotency_key() -> MetadataValue<tonic::metadata::Ascii> {
    uuid::Uuid::new_v4()
        .to_string()
        .parse()
        .expect("a UUID is ASCII")
}

/// How long a JWT lives from now, from its `exp` claim (the signature is Modal's business).
fn jwt_lifetime(token: &str) -> Option<Duration> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_u64()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    Some(Duration::from_secs(exp.saturating_sub(now)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwt_expiry_is_read_from_the_payload() {
        use base64::Engine;
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600;
        let payload =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{{\"exp\":{exp}}}"));
        let life = jwt_lifetime(&format!("h.{payload}.s")).unwrap();
        assert!(
            life > Duration::from_secs(590) && life <= Duration::from_secs(600),
            "{life:?}"
        );
        assert!(jwt_lifetime("not-a-jwt").is_none());
    }

    #[test]
    fn refusals_name_the_variables() {
        let err = to_provider_error("SandboxCreate", Status::unauthenticated("bad token"), 1);
        assert!(matches!(err, ProviderError::Auth(_)));
        assert!(err.to_string().contains("MODAL_TOKEN_ID"), "{err}");
        let err = to_provider_error("SandboxCreate", Status::unavailable("busy"), 5);
        assert!(err.to_string().contains("after 5 tries"), "{err}");
    }

    #[test]
    fn limits_are_not_retried() {
        assert!(passing(&Status::unavailable("busy")));
        assert!(!passing(&Status::resource_exhausted("message too large")));
        let err = to_provider_error(
            "ImageGetOrCreate",
            Status::resource_exhausted("message too large"),
            1,
        );
        assert!(err.to_string().contains("not retried"), "{err}");
    }
}
