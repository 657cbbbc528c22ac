//! The fake's blob storage, as Modal's SDK meets it (`modal/_utils/blob_utils.py`):
//! `BlobCreate` takes the content's MD5, SHA-256 and length and answers where to upload it,
//! a presigned URL for one PUT or, for content over the fake's part size, the part URLs and
//! completion URL of a multipart upload (Modal chooses; the SDK follows). The "bucket" is
//! served here too, under [`BUCKET_PREFIX`], as S3 answers: `ETag` = the MD5 of what was
//! stored (`-N` after the MD5 of the parts' MD5s for a completed multipart upload), a
//! `Content-MD5` that does not match refused as `BadDigest`, and errors as S3's XML. A URL is
//! authorized by its token alone, as a presigned one is. `BlobGet` answers a download URL.
//!
//! A blob is usable once all its bytes are stored and they are the length, MD5 (single PUT)
//! and SHA-256 declared at `BlobCreate`; what uses it (`MountPutFile`) checks the SHA-256.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, put};
use axum::Router;
use base64::Engine;
use bytes::Bytes;
use md5::{Digest as _, Md5};
use serde::Deserialize;
use sha2::Sha256;
use tonic::Status;

use super::limits::Origin;
use super::pb::blob_create_response::{UploadTypeOneof, UploadTypesOneof};
use super::pb::*;
use super::service::{Service, BASE62};
use super::Modal;
use crate::sandboxes::{random_hex, random_id};

/// Where the bucket is served.
pub(super) const BUCKET_PREFIX: &str = "/__bucket/blobs";
/// The largest blob taken.
const MAX_BLOB_BYTES: u64 = 1 << 30; // 1 GiB
/// Bytes kept in all blobs together, before `BlobCreate` says the fake is full.
const MAX_STORED_BYTES: u64 = 2 << 30; // 2 GiB
/// Random bytes in a URL's token.
const TOKEN_BYTES: usize = 16;

/// One blob.
struct Blob {
    length: u64,
    md5: [u8; 16],
    sha256: [u8; 32],
    token: String,
    /// `Some(part_length)`: uploaded in parts.
    part_length: Option<u64>,
    /// Uploaded parts by number, with their MD5 (multipart only).
    parts: BTreeMap<u32, (Bytes, [u8; 16])>,
    /// The content, once stored whole.
    data: Option<Bytes>,
}

/// Every blob of the fake.
#[derive(Default)]
pub(super) struct BlobTable {
    blobs: HashMap<String, Blob>,
    stored: u64,
}

impl BlobTable {
    /// The content of blob `id`, if it is stored whole.
    pub(super) fn data(&self, id: &str) -> Option<Bytes> {
        self.blobs.get(id).and_then(|b| b.data.clone())
    }
}

fn decoded<const N: usize>(b64: &str, what: &str) -> Result<[u8; N], Status> {
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or_else(|| Status::invalid_argument(format!("{what} is not a base64 digest")))
}

impl Service {
    /// `BlobCreate`: a new blob and where to upload it.
    pub(super) fn blob_create_in(
        &self,
        origin: &str,
        req: BlobCreateRequest,
    ) -> Result<BlobCreateResponse, Status> {
        let fake = &self.0;
        let length = u64::try_from(req.content_length)
            .map_err(|_| Status::invalid_argument("content_length must not be negative"))?;
        if length > MAX_BLOB_BYTES {
            return Err(Status::invalid_argument(format!(
                "the fake stores blobs of at most {MAX_BLOB_BYTES} bytes"
            )));
        }
        let md5 = decoded::<16>(&req.content_md5, "content_md5")?;
        let sha256 = decoded::<32>(&req.content_sha256_base64, "content_sha256_base64")?;
        let mut table = fake.blobs.lock().expect("blob table");
        if table.stored + length > MAX_STORED_BYTES {
            return Err(Status::resource_exhausted(
                "the fake's blob storage is full",
            ));
        }
        table.stored += length;
        let id = format!("bl-{}", random_id(22, BASE62));
        let token = random_hex(TOKEN_BYTES);
        let part = fake.config.blob_part_bytes.max(1);
        let multipart = length > part;
        let base = format!("{origin}{BUCKET_PREFIX}/{id}");
        let (single, list) = if multipart {
            let count = length.div_ceil(part);
            let upload = MultiPartUpload {
                part_length: part as i64,
                upload_urls: (1..=count)
                    .map(|n| format!("{base}/parts/{n}?token={token}"))
                    .collect(),
                completion_url: format!("{base}/complete?token={token}"),
            };
            (
                UploadTypeOneof::Multipart(upload.clone()),
                UploadTypesOneof::Multiparts(MultiPartUploadList {
                    items: vec![upload],
                }),
            )
        } else {
            let url = format!("{base}?token={token}");
            (
                UploadTypeOneof::UploadUrl(url.clone()),
                UploadTypesOneof::UploadUrls(UploadUrlList { items: vec![url] }),
            )
        };
        table.blobs.insert(
            id.clone(),
            Blob {
                length,
                md5,
                sha256,
                token,
                part_length: multipart.then_some(part),
                parts: BTreeMap::new(),
                data: None,
            },
        );
        Ok(BlobCreateResponse {
            blob_id: id.clone(),
            upload_type_oneof: Some(single),
            blob_ids: vec![id],
            upload_types_oneof: Some(list),
        })
    }

    /// `BlobGet`: where to download a stored blob.
    pub(super) fn blob_get_in(
        &self,
        origin: &str,
        req: BlobGetRequest,
    ) -> Result<BlobGetResponse, Status> {
        let table = self.0.blobs.lock().expect("blob table");
        let blob = table
            .blobs
            .get(&req.blob_id)
            .filter(|b| b.data.is_some())
            .ok_or_else(|| Status::not_found(format!("Blob {} not found", req.blob_id)))?;
        Ok(BlobGetResponse {
            download_url: format!(
                "{origin}{BUCKET_PREFIX}/{}?token={}",
                req.blob_id, blob.token
            ),
        })
    }
}

/// The origin a call came in on (see [`super::limits`]).
pub(super) fn origin<T>(req: &tonic::Request<T>) -> String {
    req.extensions()
        .get::<Origin>()
        .map_or_else(|| "http://127.0.0.1".into(), |o| o.0.clone())
}

/// The bucket's routes.
pub(super) fn routes() -> Router<Arc<Modal>> {
    Router::new()
        .route(
            &format!("{BUCKET_PREFIX}/{{id}}"),
            put(put_whole).get(download),
        )
        .route(
            &format!("{BUCKET_PREFIX}/{{id}}/parts/{{n}}"),
            put(put_part),
        )
        .route(&format!("{BUCKET_PREFIX}/{{id}}/complete"), post(complete))
}

#[derive(Debug, Deserialize)]
struct Token {
    #[serde(default)]
    token: String,
}

/// An S3 error: `<Error><Code>..</Code><Message>..</Message></Error>`.
struct S3Error {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl IntoResponse for S3Error {
    fn into_response(self) -> Response {
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message></Error>",
            self.code,
            xml_escape(&self.message)
        );
        (self.status, [("content-type", "application/xml")], body).into_response()
    }
}

fn s3_error_response(status: StatusCode, code: &'static str, message: &str) -> Response {
    s3_error(status, code, message).into_response()
}

fn s3_error(status: StatusCode, code: &'static str, message: &str) -> S3Error {
    S3Error {
        status,
        code,
        message: message.to_string(),
    }
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The blob `id` if `token` is its URL's, else S3's refusal.
fn authorized<'t>(
    table: &'t mut BlobTable,
    id: &str,
    token: &str,
) -> Result<&'t mut Blob, S3Error> {
    match table.blobs.get_mut(id) {
        Some(blob) if !token.is_empty() && blob.token == token => Ok(blob),
        _ => Err(s3_error(
            StatusCode::FORBIDDEN,
            "AccessDenied",
            "Request has expired or the signature does not match",
        )),
    }
}

async fn body_of(req: Request, limit: u64) -> Result<Bytes, S3Error> {
    axum::body::to_bytes(
        req.into_body(),
        usize::try_from(limit).unwrap_or(usize::MAX),
    )
    .await
    .map_err(|_| {
        s3_error(
            StatusCode::BAD_REQUEST,
            "EntityTooLarge",
            "Your proposed upload exceeds the maximum allowed size",
        )
    })
}

fn etag_response(etag: String) -> Response {
    (StatusCode::OK, [("etag", etag)], "").into_response()
}

/// Checks a `Content-MD5` header against `body`, as S3 does.
fn check_content_md5(headers: &HeaderMap, body: &[u8]) -> Result<(), S3Error> {
    let Some(given) = headers.get("content-md5").and_then(|v| v.to_str().ok()) else {
        return Ok(());
    };
    let actual = base64::engine::general_purpose::STANDARD.encode(Md5::digest(body));
    if given.trim() != actual {
        return Err(s3_error(
            StatusCode::BAD_REQUEST,
            "BadDigest",
            "The Content-MD5 you specified did not match what we received.",
        ));
    }
    Ok(())
}

/// `PUT {BUCKET_PREFIX}/{id}?token=`: the whole content of a single-part blob.
async fn put_whole(
    State(fake): State<Arc<Modal>>,
    Path(id): Path<String>,
    Query(q): Query<Token>,
    req: Request,
) -> Response {
    let headers = req.headers().clone();
    let expected = {
        let mut table = fake.blobs.lock().expect("blob table");
        match authorized(&mut table, &id, &q.token) {
            Ok(blob) if blob.part_length.is_some() => {
                return s3_error_response(
                    StatusCode::BAD_REQUEST,
                    "InvalidRequest",
                    "this object is uploaded in parts",
                )
            }
            Ok(blob) => (blob.length, blob.md5),
            Err(refused) => return refused.into_response(),
        }
    };
    let body = match body_of(req, expected.0).await {
        Ok(body) => body,
        Err(refused) => return refused.into_response(),
    };
    if let Err(refused) = check_content_md5(&headers, &body) {
        return refused.into_response();
    }
    if body.len() as u64 != expected.0 {
        return s3_error_response(
            StatusCode::BAD_REQUEST,
            "IncompleteBody",
            &format!(
                "You did not provide the number of bytes specified ({} of {})",
                body.len(),
                expected.0
            ),
        );
    }
    let md5: [u8; 16] = Md5::digest(&body).into();
    // The URL was signed for the MD5 declared at BlobCreate.
    if md5 != expected.1 {
        return s3_error_response(
            StatusCode::BAD_REQUEST,
            "BadDigest",
            "The Content-MD5 you specified did not match what we received.",
        );
    }
    let mut table = fake.blobs.lock().expect("blob table");
    if let Some(blob) = table.blobs.get_mut(&id) {
        blob.data = Some(body);
    }
    etag_response(format!("\"{}\"", hex::encode(md5)))
}

/// `PUT {BUCKET_PREFIX}/{id}/parts/{n}?token=`: one part of a multipart upload.
async fn put_part(
    State(fake): State<Arc<Modal>>,
    Path((id, n)): Path<(String, u32)>,
    Query(q): Query<Token>,
    req: Request,
) -> Response {
    let headers = req.headers().clone();
    let part_length = {
        let mut table = fake.blobs.lock().expect("blob table");
        match authorized(&mut table, &id, &q.token) {
            Ok(blob) => match blob.part_length {
                Some(part) if n >= 1 && u64::from(n) <= blob.length.div_ceil(part) => part,
                _ => {
                    return s3_error_response(
                        StatusCode::BAD_REQUEST,
                        "InvalidArgument",
                        &format!("part number {n} is not one of this upload's"),
                    )
                }
            },
            Err(refused) => return refused.into_response(),
        }
    };
    let body = match body_of(req, part_length).await {
        Ok(body) => body,
        Err(refused) => return refused.into_response(),
    };
    if let Err(refused) = check_content_md5(&headers, &body) {
        return refused.into_response();
    }
    let md5: [u8; 16] = Md5::digest(&body).into();
    let mut table = fake.blobs.lock().expect("blob table");
    if let Some(blob) = table.blobs.get_mut(&id) {
        blob.parts.insert(n, (body, md5));
    }
    etag_response(format!("\"{}\"", hex::encode(md5)))
}

/// `POST {BUCKET_PREFIX}/{id}/complete?token=`: `CompleteMultipartUpload`, checked as S3
/// checks it (parts in ascending order, each one's ETag, all but the last full size), then
/// the total length and SHA-256 against what `BlobCreate` declared.
async fn complete(
    State(fake): State<Arc<Modal>>,
    Path(id): Path<String>,
    Query(q): Query<Token>,
    req: Request,
) -> Response {
    let body = match body_of(req, 1 << 20).await {
        Ok(body) => body,
        Err(refused) => return refused.into_response(),
    };
    let listed = match completion_parts(&String::from_utf8_lossy(&body)) {
        Some(listed) if !listed.is_empty() => listed,
        _ => {
            return s3_error_response(
                StatusCode::BAD_REQUEST,
                "MalformedXML",
                "The XML you provided was not well-formed or did not validate against our published schema",
            )
        }
    };
    let mut table = fake.blobs.lock().expect("blob table");
    let blob = match authorized(&mut table, &id, &q.token) {
        Ok(blob) => blob,
        Err(refused) => return refused.into_response(),
    };
    let Some(part_length) = blob.part_length else {
        return s3_error_response(
            StatusCode::NOT_FOUND,
            "NoSuchUpload",
            "The specified multipart upload does not exist",
        );
    };
    let mut whole = Vec::with_capacity(usize::try_from(blob.length).unwrap_or(0));
    let mut digests = Vec::new();
    for (i, (number, etag)) in listed.iter().enumerate() {
        if *number != i as u32 + 1 {
            return s3_error_response(
                StatusCode::BAD_REQUEST,
                "InvalidPartOrder",
                "The list of parts was not in ascending order",
            );
        }
        let Some((data, md5)) = blob.parts.get(number) else {
            return s3_error_response(
                StatusCode::BAD_REQUEST,
                "InvalidPart",
                &format!("part {number} was not uploaded"),
            );
        };
        if *etag != hex::encode(md5) {
            return s3_error_response(
                StatusCode::BAD_REQUEST,
                "InvalidPart",
                &format!("part {number}'s ETag is not the one uploaded"),
            );
        }
        if i + 1 < listed.len() && data.len() as u64 != part_length {
            return s3_error_response(
                StatusCode::BAD_REQUEST,
                "EntityTooSmall",
                "Your proposed upload is smaller than the minimum allowed object size",
            );
        }
        whole.extend_from_slice(data);
        digests.extend_from_slice(md5);
    }
    if whole.len() as u64 != blob.length {
        return s3_error_response(
            StatusCode::BAD_REQUEST,
            "IncompleteBody",
            &format!(
                "the parts hold {} bytes, not the {} declared",
                whole.len(),
                blob.length
            ),
        );
    }
    let sha256: [u8; 32] = Sha256::digest(&whole).into();
    if sha256 != blob.sha256 {
        return s3_error_response(
            StatusCode::BAD_REQUEST,
            "BadDigest",
            "The SHA-256 of the parts is not the one declared",
        );
    }
    let etag = format!("{}-{}", hex::encode(Md5::digest(&digests)), listed.len());
    blob.parts.clear();
    blob.data = Some(Bytes::from(whole));
    let answer = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CompleteMultipartUploadResult>\
         <Bucket>modal-blobs</Bucket><Key>{id}</Key><ETag>\"{etag}\"</ETag>\
         </CompleteMultipartUploadResult>"
    );
    (
        StatusCode::OK,
        [("content-type", "application/xml")],
        answer,
    )
        .into_response()
}

/// The `(PartNumber, ETag)` pairs of a `CompleteMultipartUpload` body, in order; `None` when
/// it is not one.
fn completion_parts(xml: &str) -> Option<Vec<(u32, String)>> {
    let body = xml
        .trim()
        .strip_prefix("<CompleteMultipartUpload>")?
        .strip_suffix("</CompleteMultipartUpload>")?;
    let mut parts = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let inner_end = rest.find("</Part>")?;
        let inner = rest
            .strip_prefix("<Part>")?
            .get(..inner_end - "<Part>".len())?;
        let number = between(inner, "<PartNumber>", "</PartNumber>")?
            .trim()
            .parse()
            .ok()?;
        let etag = between(inner, "<ETag>", "</ETag>")?
            .trim()
            .trim_matches('"')
            .to_string();
        parts.push((number, etag));
        rest = rest[inner_end + "</Part>".len()..].trim();
    }
    Some(parts)
}

fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let end = start + text[start..].find(close)?;
    Some(&text[start..end])
}

/// `GET {BUCKET_PREFIX}/{id}?token=`: a stored blob's bytes (`BlobGet`'s URL).
async fn download(
    State(fake): State<Arc<Modal>>,
    Path(id): Path<String>,
    Query(q): Query<Token>,
) -> Response {
    let mut table = fake.blobs.lock().expect("blob table");
    match authorized(&mut table, &id, &q.token) {
        Ok(Blob {
            data: Some(data),
            md5,
            ..
        }) => {
            let etag = format!("\"{}\"", hex::encode(md5));
            (StatusCode::OK, [("etag", etag)], Body::from(data.clone())).into_response()
        }
        Ok(_) => s3_error_response(
            StatusCode::NOT_FOUND,
            "NoSuchKey",
            "The specified key does not exist.",
        ),
        Err(refused) => refused.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_bodies_parse_as_the_sdk_writes_them() {
        let body = "<CompleteMultipartUpload>\n<Part>\n<PartNumber>1</PartNumber>\n\
                    <ETag>\"aa\"</ETag>\n</Part>\n<Part>\n<PartNumber>2</PartNumber>\n\
                    <ETag>\"bb\"</ETag>\n</Part>\n</CompleteMultipartUpload>";
        assert_eq!(
            completion_parts(body).unwrap(),
            [(1, "aa".to_string()), (2, "bb".to_string())]
        );
        assert!(completion_parts("<Other/>").is_none());
        assert!(
            completion_parts("<CompleteMultipartUpload><Part>x</CompleteMultipartUpload>")
                .is_none()
        );
    }
}
