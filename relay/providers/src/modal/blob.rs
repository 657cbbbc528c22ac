//! Modal's blob storage, as the SDK uses it for every file of 4 MiB or more
//! (`modal/_utils/blob_utils.py`): `BlobCreate` with the content's MD5 and SHA-256 and its
//! length answers one or more places to upload it, each with its blob id; the bytes go there
//! over plain HTTPS (a presigned S3 or R2 URL for one PUT, or the part URLs and completion URL
//! of a multipart upload), and the blob id then stands for the bytes in a gRPC message
//! (`MountPutFile.data_blob_id`). Each place is tried in turn until one takes the upload.
//!
//! Storage's answers are checked as the SDK checks them: a single PUT's `ETag` is the MD5 of
//! what was sent; each part's too, and the completed upload's is the MD5 of the parts' MD5s
//! followed by `-N`. A mismatch fails the upload instead of building on corrupt bytes.

use std::time::Duration;

use anyhow::anyhow;
use base64::Engine;
use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use md5::{Digest as _, Md5};
use sha2::Sha256;

use super::client::Modal;
use super::pb;
use crate::cloud::http::quote;
use tether_relay_core::provider::ProviderError;

/// How long one PUT (or one part) may take.
const PUT_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// Tries of one PUT in all (the SDK's `_upload_to_s3_url` retries 3 times).
const PUT_ATTEMPTS: u32 = 3;
/// The pause before another try of a PUT; S3's 503 ("SlowDown") asks for one second.
const PUT_RETRY_PAUSE: Duration = Duration::from_secs(1);
/// Parts of a multipart upload sent at once.
const PARALLEL_PARTS: usize = 4;

/// Where `BlobCreate` said to upload: one alternative, with the blob id it makes.
#[derive(Debug)]
enum Target {
    /// One PUT of the whole content.
    Single(String),
    /// A multipart upload.
    Multipart(pb::MultiPartUpload),
}

/// The hashes `BlobCreate` and storage want.
#[derive(Debug)]
struct Hashes {
    md5: [u8; 16],
    sha256: [u8; 32],
}

impl Hashes {
    fn of(data: &[u8]) -> Hashes {
        Hashes {
            md5: Md5::digest(data).into(),
            sha256: Sha256::digest(data).into(),
        }
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Uploads `data` to Modal's blob storage; returns its blob id.
pub(super) async fn upload(
    modal: &Modal,
    http: &reqwest::Client,
    data: Bytes,
) -> Result<String, ProviderError> {
    let hashes = Hashes::of(&data);
    let req = pb::BlobCreateRequest {
        content_md5: b64(&hashes.md5),
        content_sha256_base64: b64(&hashes.sha256),
        content_length: data.len() as i64,
    };
    let answer = modal
        .call("BlobCreate", req, |mut c, r| async move {
            c.blob_create(r).await
        })
        .await?;
    let targets = targets(answer)?;
    let mut last = None;
    for (blob_id, target) in targets {
        let sent = match &target {
            Target::Single(url) => put_whole(http, url, &data, &hashes).await,
            Target::Multipart(parts) => put_parts(http, parts, &data).await,
        };
        match sent {
            Ok(()) => return Ok(blob_id),
            // Another place may take it (the SDK falls back in the same order).
            Err(e) => {
                tracing::debug!("Modal blob {blob_id}: {e}; trying the next place");
                last = Some(e);
            }
        }
    }
    Err(ProviderError::Other(anyhow!(
        "uploading {} bytes to Modal's blob storage failed: {}",
        data.len(),
        last.map_or_else(|| "Modal gave nowhere to upload".into(), |e| e.to_string())
    )))
}

/// The alternatives of a `BlobCreate` answer, in order: the lists (`blob_ids` with
/// `upload_urls` or `multiparts`), else the older single `blob_id` with its target.
fn targets(answer: pb::BlobCreateResponse) -> Result<Vec<(String, Target)>, ProviderError> {
    use pb::blob_create_response::{UploadTypeOneof, UploadTypesOneof};
    let listed: Vec<Target> = match answer.upload_types_oneof {
        Some(UploadTypesOneof::UploadUrls(urls)) => {
            urls.items.into_iter().map(Target::Single).collect()
        }
        Some(UploadTypesOneof::Multiparts(parts)) => {
            parts.items.into_iter().map(Target::Multipart).collect()
        }
        None => Vec::new(),
    };
    if !listed.is_empty() {
        if listed.len() != answer.blob_ids.len() {
            return Err(ProviderError::Other(anyhow!(
                "Modal's BlobCreate gave {} places to upload but {} blob ids",
                listed.len(),
                answer.blob_ids.len()
            )));
        }
        return Ok(answer.blob_ids.into_iter().zip(listed).collect());
    }
    let single = match answer.upload_type_oneof {
        Some(UploadTypeOneof::UploadUrl(url)) => Target::Single(url),
        Some(UploadTypeOneof::Multipart(parts)) => Target::Multipart(parts),
        None => {
            return Err(ProviderError::Other(anyhow!(
                "Modal's BlobCreate gave nowhere to upload"
            )))
        }
    };
    Ok(vec![(answer.blob_id, single)])
}

/// Why one place did not take the upload.
#[derive(Debug, thiserror::Error)]
enum PutError {
    #[error("cannot reach {host}: {source}")]
    Network {
        host: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{host} answered HTTP {status}: {body}")]
    Status {
        host: String,
        status: u16,
        body: String,
    },
    #[error("{0}")]
    Check(String),
}

impl PutError {
    /// Worth another try: the network, or storage busy.
    fn passing(&self) -> bool {
        match self {
            PutError::Network { .. } => true,
            PutError::Status { status, .. } => *status >= 500,
            PutError::Check(_) => false,
        }
    }
}

/// Where a URL points, for messages: never its query, which holds the presigned signature.
fn host_of(url: &str) -> String {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(|h| format!("{}{}", h, u.path())))
        .unwrap_or_else(|| "Modal's blob storage".into())
}

/// Whether to send `Content-MD5` on a single PUT: storage checks it (and a presigned URL may
/// demand it), so it is sent except to a store on this machine or a private network, where
/// the SDK leaves it off for test stores that cannot check it.
fn sends_md5(url: &str) -> bool {
    let Some(host) = reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
    else {
        return true;
    };
    if host == "localhost" {
        return false;
    }
    match host.trim_matches(['[', ']']).parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(ip)) => !(ip.is_loopback() || ip.is_private()),
        Ok(std::net::IpAddr::V6(ip)) => !(ip.is_loopback() || ip.is_unique_local()),
        Err(_) => true,
    }
}

/// A PUT of `body` to `url`, tried again after a passing failure; returns the ETag without
/// its quotes (or weak prefix).
async fn put(
    http: &reqwest::Client,
    url: &str,
    body: Bytes,
    headers: &[(&str, String)],
) -> Result<String, PutError> {
    let host = host_of(url);
    let mut tries = 0;
    loop {
        tries += 1;
        let mut req = http.put(url).timeout(PUT_TIMEOUT).body(body.clone());
        for (name, value) in headers {
            req = req.header(*name, value);
        }
        let failure = match req.send().await {
            Err(source) => PutError::Network {
                host: host.clone(),
                source,
            },
            Ok(resp) if resp.status().as_u16() == 200 => {
                let etag = resp
                    .headers()
                    .get("etag")
                    .and_then(|v| v.to_str().ok())
                    .map(unquote_etag);
                return etag.ok_or_else(|| {
                    PutError::Check(format!("{host} answered the upload without an ETag"))
                });
            }
            Ok(resp) => {
                let status = resp.status().as_u16();
                let body = resp.bytes().await.unwrap_or_default();
                PutError::Status {
                    host: host.clone(),
                    status,
                    body: quote(&body),
                }
            }
        };
        if !failure.passing() || tries >= PUT_ATTEMPTS {
            return Err(failure);
        }
        tracing::debug!("upload to {host} failed ({failure}); trying again");
        tokio::time::sleep(PUT_RETRY_PAUSE).await;
    }
}

/// An ETag's value: `"abc"` and `W/"abc"` are `abc`.
fn unquote_etag(raw: &str) -> String {
    let raw = raw.trim();
    let raw = raw
        .strip_prefix("W/")
        .or_else(|| raw.strip_prefix("w/"))
        .unwrap_or(raw);
    raw.trim_matches('"').to_string()
}

/// The whole content in one PUT, its ETag checked against its MD5.
async fn put_whole(
    http: &reqwest::Client,
    url: &str,
    data: &Bytes,
    hashes: &Hashes,
) -> Result<(), PutError> {
    let mut headers = vec![("content-type", "application/octet-stream".to_string())];
    if sends_md5(url) {
        headers.push(("content-md5", b64(&hashes.md5)));
    }
    let etag = put(http, url, data.clone(), &headers).await?;
    let local = hex::encode(hashes.md5);
    if etag != local {
        return Err(PutError::Check(format!(
            "storage holds other bytes than were sent (MD5 {etag}, sent {local})"
        )));
    }
    Ok(())
}

/// The content in parts of `part_length` bytes, one per URL, then the completion; every
/// ETag checked.
async fn put_parts(
    http: &reqwest::Client,
    plan: &pb::MultiPartUpload,
    data: &Bytes,
) -> Result<(), PutError> {
    let ranges = part_ranges(data.len(), plan)?;
    // Each part's future owns what it uses (the client and the bytes are shared handles), so
    // the stream of them is `Send` whatever the caller's lifetimes.
    let parts = ranges
        .into_iter()
        .zip(plan.upload_urls.iter().cloned())
        .map(|((start, end), url)| {
            let (http, part) = (http.clone(), data.slice(start..end));
            async move {
                let local = hex::encode(Md5::digest(&part));
                // Parts carry no Content-Type or Content-MD5, as the SDK sends them.
                let etag = put(&http, &url, part, &[]).await?;
                if etag != local {
                    return Err(PutError::Check(format!(
                        "storage holds other bytes than were sent for bytes {start}..{end} \
                         (MD5 {etag}, sent {local})"
                    )));
                }
                Ok(etag)
            }
        });
    let etags: Vec<String> = futures_util::stream::iter(parts)
        .buffered(PARALLEL_PARTS)
        .try_collect()
        .await?;
    let (body, expected) = completion(&etags)?;
    let host = host_of(&plan.completion_url);
    let resp = http
        .post(&plan.completion_url)
        .timeout(PUT_TIMEOUT)
        .body(body)
        .send()
        .await
        .map_err(|source| PutError::Network {
            host: host.clone(),
            source,
        })?;
    let status = resp.status().as_u16();
    let answer = resp.bytes().await.unwrap_or_default();
    if status != 200 {
        return Err(PutError::Status {
            host,
            status,
            body: quote(&answer),
        });
    }
    if !String::from_utf8_lossy(&answer).contains(&expected) {
        return Err(PutError::Check(format!(
            "the completed upload is not the parts sent (expected ETag {expected}, storage \
             answered {})",
            quote(&answer)
        )));
    }
    Ok(())
}

/// The byte range of each part: `part_length` bytes each, the last one what remains. The
/// URLs must be exactly as many as the parts.
fn part_ranges(len: usize, plan: &pb::MultiPartUpload) -> Result<Vec<(usize, usize)>, PutError> {
    let part = usize::try_from(plan.part_length).unwrap_or(0);
    let wanted = if part == 0 {
        0
    } else {
        len.div_ceil(part).max(1)
    };
    if part == 0 || wanted != plan.upload_urls.len() {
        return Err(PutError::Check(format!(
            "Modal planned {} parts of {} bytes for {len} bytes",
            plan.upload_urls.len(),
            plan.part_length
        )));
    }
    Ok((0..wanted)
        .map(|i| (i * part, ((i + 1) * part).min(len)))
        .collect())
}

/// The `CompleteMultipartUpload` body naming each part's ETag, and the ETag the whole then
/// has: the MD5 of the parts' MD5s, then `-` and the count.
fn completion(etags: &[String]) -> Result<(Vec<u8>, String), PutError> {
    let mut body = String::from("<CompleteMultipartUpload>");
    let mut digests = Vec::with_capacity(etags.len() * 16);
    for (n, etag) in etags.iter().enumerate() {
        body.push_str(&format!(
            "\n<Part>\n<PartNumber>{}</PartNumber>\n<ETag>\"{etag}\"</ETag>\n</Part>",
            n + 1
        ));
        let digest = hex::decode(etag)
            .map_err(|_| PutError::Check(format!("part ETag {etag:?} is not an MD5")))?;
        digests.extend_from_slice(&digest);
    }
    body.push_str("\n</CompleteMultipartUpload>");
    let whole = format!("{}-{}", hex::encode(Md5::digest(&digests)), etags.len());
    Ok((body.into_bytes(), whole))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newer_lists_win_and_the_older_fields_still_work() {
        use pb::blob_create_response::{UploadTypeOneof, UploadTypesOneof};
        let both = pb::BlobCreateResponse {
            blob_id: "bl-old".into(),
            upload_type_oneof: Some(UploadTypeOneof::UploadUrl("http://old".into())),
            blob_ids: vec!["bl-1".into(), "bl-2".into()],
            upload_types_oneof: Some(UploadTypesOneof::UploadUrls(pb::UploadUrlList {
                items: vec!["http://one".into(), "http://two".into()],
            })),
        };
        let got = targets(both).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].0, "bl-2");
        assert!(matches!(&got[1].1, Target::Single(u) if u == "http://two"));
        let old = pb::BlobCreateResponse {
            blob_id: "bl-old".into(),
            upload_type_oneof: Some(UploadTypeOneof::UploadUrl("http://old".into())),
            ..Default::default()
        };
        let got = targets(old).unwrap();
        assert_eq!(got[0].0, "bl-old");
        assert!(targets(pb::BlobCreateResponse::default()).is_err());
    }

    #[test]
    fn parts_cover_the_content_exactly() {
        let plan = |part_length: i64, urls: usize| pb::MultiPartUpload {
            part_length,
            upload_urls: vec!["u".into(); urls],
            completion_url: "c".into(),
        };
        assert_eq!(
            part_ranges(10, &plan(4, 3)).unwrap(),
            [(0, 4), (4, 8), (8, 10)]
        );
        assert_eq!(part_ranges(8, &plan(4, 2)).unwrap(), [(0, 4), (4, 8)]);
        assert!(part_ranges(10, &plan(4, 2)).is_err());
        assert!(part_ranges(10, &plan(0, 1)).is_err());
    }

    #[test]
    fn the_completed_etag_is_s3s() {
        // S3: md5(md5(part1) || md5(part2)) + "-2".
        let parts = [b"hello ".as_slice(), b"world".as_slice()];
        let etags: Vec<String> = parts.iter().map(|p| hex::encode(Md5::digest(p))).collect();
        let (body, whole) = completion(&etags).unwrap();
        let mut joined = Vec::new();
        for p in parts {
            joined.extend_from_slice(&Md5::digest(p));
        }
        assert_eq!(whole, format!("{}-2", hex::encode(Md5::digest(&joined))));
        let body = String::from_utf8(body).unwrap();
        assert!(body.contains("<PartNumber>2</PartNumber>"), "{body}");
        assert!(
            body.contains(&format!("<ETag>\"{}\"</ETag>", etags[0])),
            "{body}"
        );
    }

    #[test]
    fn md5_goes_to_real_stores_only() {
        assert!(sends_md5(
            "https://bucket.s3.us-east-1.amazonaws.com/x?sig=1"
        ));
        assert!(sends_md5("https://acct.r2.cloudflarestorage.com/x"));
        assert!(!sends_md5("http://127.0.0.1:9000/x"));
        assert!(!sends_md5("http://localhost:9000/x"));
        assert!(!sends_md5("http://10.1.2.3/x"));
        assert_eq!(unquote_etag("W/\"abc\""), "abc");
        assert_eq!(unquote_etag("\"abc\""), "abc");
    }
}
