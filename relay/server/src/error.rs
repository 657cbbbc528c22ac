//! Every error the relay answers with, and the one place that maps each to its HTTP status and
//! wire code ([`ErrorBody`]).

use std::path::PathBuf;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tracing::{error, warn};

use tether_client::api::{ErrorBody, ErrorDetail};
use tether_relay_core::provider::ProviderError;
use tether_store::{DestroyReason, Destroyed, SandboxId, StoreError};

/// A failed request. Each message is a sentence the user can act on.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No token, or one this relay does not know.
    #[error(
        "{reason}: set TETHER_TOKEN to a token from `tether token create`, or to the admin \
         token in {}", admin_token_file.display()
    )]
    Unauthorized {
        /// What was wrong with the request's token.
        reason: &'static str,
        /// Where the relay keeps its admin token.
        admin_token_file: PathBuf,
    },
    /// A relay-to-relay request without a valid grant.
    #[error("{0}")]
    PeerRefused(String),
    /// A valid token that may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// No such sandbox for this tenant, or no such route.
    #[error("{0}")]
    NotFound(String),
    /// The relay itself deleted the sandbox (TTL, idle, gone), as its journal records.
    #[error("{0}")]
    Deleted(String),
    /// The sandbox's agent has exited: it exists, for `rm`, but nothing can run in it.
    #[error("{0}")]
    Dead(String),
    /// The request is malformed or asks for something invalid.
    #[error("{0}")]
    Invalid(String),
    /// The request's body is larger than the route accepts.
    #[error("{0}")]
    TooLarge(String),
    /// The request's body did not arrive in time.
    #[error("{0}")]
    BodyTimeout(String),
    /// The HTTP method does not apply to the path.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// The sandbox is in a state the request cannot start from (pausing a paused one).
    #[error("{0}")]
    Conflict(String),
    /// The sandbox's provider has no such feature.
    #[error("{0}")]
    Unsupported(String),
    /// The provider failed or refused.
    #[error("{0}")]
    Provider(String),
    /// The provider (or something the relay needs) is unavailable on this host.
    #[error("{0}")]
    Unavailable(String),
    /// A bug or a broken data directory.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// The tenant has no sandbox `id` (or another tenant has it: not revealed).
    pub(super) fn no_sandbox(id: &SandboxId) -> ApiError {
        ApiError::NotFound(format!(
            "sandbox {id} not found; `tether ls` lists your sandboxes"
        ))
    }

    /// The sandbox's agent has exited: nothing can run in it, but it exists until removed.
    pub(super) fn dead(id: &SandboxId) -> ApiError {
        ApiError::Dead(format!(
            "the agent of sandbox {id} has exited, so the sandbox is dead; `tether rm {id}` \
             removes what is left of it, then create a new one"
        ))
    }

    /// The relay deleted the tenant's sandbox on its own; `entry` says when and why.
    pub(super) fn deleted(entry: &Destroyed) -> ApiError {
        let why = match entry.reason {
            DestroyReason::Ttl => "its TTL ran out",
            DestroyReason::Idle => "no client was connected for its idle timeout",
            DestroyReason::Gone => "its provider reported it gone",
        };
        let at = humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH
                + std::time::Duration::from_millis(u64::try_from(entry.at_ms).unwrap_or(0)),
        );
        ApiError::Deleted(format!(
            "sandbox {} was deleted by the relay at {at}: {why} ({}); create a new one",
            entry.id, entry.evidence
        ))
    }

    /// Maps a provider's failure on sandbox `id` (if there is one yet) to a response.
    pub(super) fn provider(provider: &str, id: Option<&SandboxId>, err: ProviderError) -> ApiError {
        match err {
            ProviderError::Unavailable(msg) => {
                ApiError::Unavailable(format!("provider `{provider}` is unavailable: {msg}"))
            }
            ProviderError::InvalidSpec(msg) => ApiError::Invalid(msg),
            ProviderError::Gone(_) => ApiError::NotFound(format!(
                "sandbox {} no longer exists at provider `{provider}`; create a new one",
                id.map_or("?", |id| id.as_str())
            )),
            ProviderError::Auth(msg) => ApiError::Provider(msg),
            ProviderError::Unsupported(msg) => ApiError::Unsupported(msg),
            ProviderError::Conflict(msg) => ApiError::Conflict(msg),
            ProviderError::Other(e) => ApiError::Provider(match id {
                Some(id) => format!("provider `{provider}` failed on sandbox {id}: {e:#}"),
                None => format!("provider `{provider}` failed: {e:#}"),
            }),
        }
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Unauthorized { .. } | ApiError::PeerRefused(_) => {
                (StatusCode::UNAUTHORIZED, "unauthorized")
            }
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::Deleted(_) => (StatusCode::GONE, "deleted"),
            ApiError::Dead(_) => (StatusCode::GONE, "gone"),
            ApiError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_argument"),
            ApiError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "invalid_argument"),
            ApiError::BodyTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "invalid_argument"),
            ApiError::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "invalid_argument"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::Unsupported(_) => (StatusCode::NOT_IMPLEMENTED, "unsupported"),
            ApiError::Provider(_) => (StatusCode::BAD_GATEWAY, "provider_error"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        if e.is_disk_full() {
            // Nothing the request did wrong, and over once space is freed; the message says so.
            return ApiError::Unavailable(e.to_string());
        }
        ApiError::Internal(format!("{e}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let message = self.to_string();
        if status.is_server_error() {
            if status == StatusCode::INTERNAL_SERVER_ERROR {
                error!("{message}");
            } else {
                warn!("{message}");
            }
        }
        let body = ErrorBody {
            error: ErrorDetail {
                code: code.to_string(),
                message,
            },
        };
        (status, Json(body)).into_response()
    }
}
