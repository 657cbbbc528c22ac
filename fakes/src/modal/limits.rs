//! What the fake's gRPC front door checks before a call reaches the service, as a gRPC server
//! does: a request message over gRPC's default receive limit (4 MiB) is refused with
//! `RESOURCE_EXHAUSTED` from its length prefix, in the words of grpc-go ("received message
//! larger than max"); and the address the caller used (its `:authority`) is kept for the
//! service, which hands out URLs on it (blob uploads).

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;

/// The largest request message accepted: gRPC's default receive limit. The SDKs never send a
/// larger one (files of 4 MiB or more go through blob storage).
pub(super) const MAX_MESSAGE_BYTES: usize = 4 << 20; // 4 MiB
/// gRPC's message prefix: a compression flag and a big-endian u32 length.
const PREFIX_BYTES: usize = 5;
/// Of a refused request, at most this much more is read (and dropped) before the answer, so
/// an ordinary client sees the status rather than a reset stream.
const MAX_DRAIN_BYTES: usize = 128 << 20; // 128 MiB

/// The `scheme://host:port` a call came in on.
#[derive(Clone, Debug)]
pub(super) struct Origin(pub String);

/// The middleware: records the [`Origin`], then refuses a first message over the limit.
pub(super) async fn check(mut req: Request, next: Next) -> Response {
    let authority = req
        .uri()
        .authority()
        .map(|a| a.to_string())
        .or_else(|| {
            req.headers()
                .get("host")
                .and_then(|h| h.to_str().ok())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "127.0.0.1".into());
    req.extensions_mut()
        .insert(Origin(format!("http://{authority}")));
    let grpc = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/grpc"));
    if !grpc {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let mut stream = body.into_data_stream();
    let mut head = BytesMut::new();
    while head.len() < PREFIX_BYTES {
        match stream.next().await {
            Some(Ok(chunk)) => head.extend_from_slice(&chunk),
            _ => break,
        }
    }
    if head.len() >= PREFIX_BYTES {
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > MAX_MESSAGE_BYTES {
            let mut drained = head.len();
            while drained < MAX_DRAIN_BYTES {
                match stream.next().await {
                    Some(Ok(chunk)) => drained += chunk.len(),
                    _ => break,
                }
            }
            return refused(len);
        }
    }
    let rest = futures_util::stream::once(async move { Ok::<Bytes, axum::Error>(head.freeze()) })
        .chain(stream);
    next.run(Request::from_parts(parts, Body::from_stream(rest)))
        .await
}

/// A trailers-only gRPC answer: `RESOURCE_EXHAUSTED` for a message of `len` bytes.
fn refused(len: usize) -> Response {
    let message = format!("grpc: received message larger than max ({len} vs. {MAX_MESSAGE_BYTES})");
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::OK;
    let headers = resp.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    // RESOURCE_EXHAUSTED.
    headers.insert("grpc-status", HeaderValue::from_static("8"));
    headers.insert(
        "grpc-message",
        HeaderValue::from_str(&message).expect("printable ASCII"),
    );
    resp
}
