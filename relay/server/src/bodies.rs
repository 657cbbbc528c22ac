//! Request bodies of the API, bounded so that a slow or lying client cannot hold a
//! connection: a body declared (`Content-Length`) larger than [`MAX_API_BODY`] is answered
//! 413 before a byte of it is read, and a body that has not fully arrived within the body
//! timeout (`tether serve --body-timeout`) after its request's head, whether it stalls or
//! trickles, fails with [`TimedOut`], which [`rejection`] answers with a 408. Either way the
//! rest of the body is never read, so its connection closes after the answer.
//!
//! [`guard`] wraps every API route; the body is still read by the handler's extractor, after
//! the caller's token has been checked, so an unauthenticated client gets its 401 without
//! the relay buffering anything for it. Preview requests are not API requests: their bodies
//! stream to the sandbox's app, which sets its own limits.
//!
//! [`JsonBody`] reads a JSON body and turns every malformed one into an [`ErrorBody`] 400.
//!
//! [`ErrorBody`]: tether_client::api::ErrorBody

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request, State};
use axum::http::header::{self, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};
use serde::de::DeserializeOwned;
use std::future::Future;
use tokio::time::Sleep;

use super::constants::MAX_API_BODY;
use super::error::ApiError;

/// Refuses a body declared too large, and gives the body the rest of `timeout` to arrive.
pub(super) async fn guard(
    State(timeout): State<Duration>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(declared) = declared_length(&request) {
        if declared > MAX_API_BODY as u64 {
            let mut response = too_large(Some(declared)).into_response();
            // Said, not only done: hyper would close it anyway, since the body is unread.
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return response;
        }
    }
    let request = request.map(|body| {
        Body::new(Deadline {
            inner: body,
            timer: Box::pin(tokio::time::sleep(timeout)),
            timeout,
        })
    });
    next.run(request).await
}

/// The answer to a body an extractor could not read: a 408 when it did not arrive in time,
/// a 413 when it was longer than the limit, otherwise a 400.
pub(super) fn rejection(e: BytesRejection) -> ApiError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(error) = source {
        if let Some(TimedOut(timeout)) = error.downcast_ref::<TimedOut>() {
            return ApiError::BodyTimeout(format!(
                "the request body did not arrive within {}; send the whole body at once, or \
                 ask the relay's operator for a longer `tether serve --body-timeout`",
                humantime::format_duration(*timeout)
            ));
        }
        if error.is::<http_body_util::LengthLimitError>() {
            return too_large(None);
        }
        source = error.source();
    }
    ApiError::Invalid(format!("cannot read the request body: {}", e.body_text()))
}

/// The body's declared length; `None` when it declares none (chunked, or no body), or one
/// that is not a number (hyper refuses those before they get here).
fn declared_length(request: &Request) -> Option<u64> {
    request
        .headers()
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// The 413 for a body of `declared` bytes, or (`None`) one that turned out longer than it
/// declared.
fn too_large(declared: Option<u64>) -> ApiError {
    let what = match declared {
        Some(n) => format!("declares {n} bytes, more"),
        None => "is longer".to_string(),
    };
    ApiError::TooLarge(format!(
        "the request body {what} than the {MAX_API_BODY} bytes an API request may carry; send \
         a smaller request"
    ))
}

/// A request body did not arrive within the body timeout.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub(super) struct TimedOut(Duration);

/// A body that fails with [`TimedOut`] once its timer fires before its end.
struct Deadline {
    inner: Body,
    timer: Pin<Box<Sleep>>,
    timeout: Duration,
}

impl HttpBody for Deadline {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match this.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(TimedOut(this.timeout))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A JSON request body. An empty body reads as `{}`, so bodies whose fields all have
/// defaults may be left out.
pub(crate) struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<JsonBody<T>, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(rejection)?;
        let body: &[u8] = if bytes.trim_ascii().is_empty() {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(body)
            .map(JsonBody)
            .map_err(|e| ApiError::Invalid(format!("invalid request body: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::FromRequest;

    /// A body whose sender never sends: it fails with [`TimedOut`] at the timeout, and that
    /// is answered as a 408.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_times_out_as_a_408() {
        let stalled =
            Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>());
        let timeout = Duration::from_secs(7);
        let request = Request::new(Body::new(Deadline {
            inner: stalled,
            timer: Box::pin(tokio::time::sleep(timeout)),
            timeout,
        }));
        let started = tokio::time::Instant::now();
        let read = Bytes::from_request(request, &()).await.unwrap_err();
        assert_eq!(started.elapsed(), timeout);
        let error = rejection(read);
        assert!(matches!(error, ApiError::BodyTimeout(_)), "{error:?}");
        assert_eq!(
            error.into_response().status(),
            axum::http::StatusCode::REQUEST_TIMEOUT
        );
    }
}
