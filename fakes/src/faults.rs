//! Failures on demand, so clients' retries and error paths can be exercised: `POST
//! /__fake/faults` with `{"status": 429, "count": 2, "retry_after": 1, "path": "/v2/"}`
//! makes the next `count` API requests whose path starts with `path` (any, when absent)
//! answer `status`, with `Retry-After: retry_after` when given, in the provider's own error
//! format. `DELETE /__fake/faults` clears them. The edge and envd are never failed.

use std::collections::VecDeque;
use std::sync::Mutex;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

/// The largest control request read.
const MAX_CONTROL_BODY: usize = 1 << 16; // 64 KiB

/// One failure to inject, as posted.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct FaultSpec {
    /// The HTTP status to answer (or, for gRPC fakes, mapped to the nearest gRPC code).
    pub status: u16,
    /// How many requests fail.
    #[serde(default = "one")]
    pub count: u32,
    /// Seconds for `Retry-After`.
    #[serde(default)]
    pub retry_after: Option<u64>,
    /// Only requests whose path starts with this.
    #[serde(default)]
    pub path: Option<String>,
}

fn one() -> u32 {
    1
}

/// A failure to answer one request with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fault {
    /// The status.
    pub status: u16,
    /// Seconds for `Retry-After`.
    pub retry_after: Option<u64>,
}

/// The pending failures of one fake.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    pending: Mutex<VecDeque<FaultSpec>>,
}

impl Faults {
    /// Queues `spec`.
    pub(crate) fn add(&self, spec: FaultSpec) {
        self.pending.lock().expect("faults").push_back(spec);
    }

    /// Drops every pending failure.
    pub(crate) fn clear(&self) {
        self.pending.lock().expect("faults").clear();
    }

    /// Serves `POST /__fake/faults` (a [`FaultSpec`]) and `DELETE /__fake/faults`.
    pub(crate) async fn control(&self, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        match (parts.method.as_str(), parts.uri.path()) {
            ("POST", "/__fake/faults") => {
                let bytes = axum::body::to_bytes(body, MAX_CONTROL_BODY)
                    .await
                    .unwrap_or_default();
                match serde_json::from_slice::<FaultSpec>(&bytes) {
                    Ok(spec) => {
                        self.add(spec);
                        StatusCode::NO_CONTENT.into_response()
                    }
                    Err(e) => {
                        (StatusCode::BAD_REQUEST, format!("bad fault: {e}\n")).into_response()
                    }
                }
            }
            ("DELETE", "/__fake/faults") => {
                self.clear();
                StatusCode::NO_CONTENT.into_response()
            }
            _ => (
                StatusCode::NOT_FOUND,
                "no such control; see fakes/README.md\n",
            )
                .into_response(),
        }
    }

    /// The failure the request to `path` must get, if any (and counts it).
    pub(crate) fn take(&self, path: &str) -> Option<Fault> {
        let mut pending = self.pending.lock().expect("faults");
        let index = pending
            .iter()
            .position(|f| f.path.as_deref().is_none_or(|p| path.starts_with(p)))?;
        let spec = &mut pending[index];
        let fault = Fault {
            status: spec.status,
            retry_after: spec.retry_after,
        };
        spec.count = spec.count.saturating_sub(1);
        if spec.count == 0 {
            pending.remove(index);
        }
        Some(fault)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_counted_and_matched_by_path() {
        let faults = Faults::default();
        faults.add(FaultSpec {
            status: 429,
            count: 2,
            retry_after: Some(1),
            path: Some("/v2/".into()),
        });
        assert_eq!(faults.take("/sandboxes/x"), None);
        let fault = Fault {
            status: 429,
            retry_after: Some(1),
        };
        assert_eq!(faults.take("/v2/sandboxes"), Some(fault.clone()));
        assert_eq!(faults.take("/v2/sandboxes"), Some(fault));
        assert_eq!(faults.take("/v2/sandboxes"), None);
    }
}
