//! A client for one repository of a registry, speaking the OCI distribution API
//! (<https://github.com/opencontainers/distribution-spec/blob/main/spec.md>): blob existence,
//! uploads (one PUT, or PATCH chunks and a closing PUT), manifest PUT; manifest and blob GET
//! for pulls. A request refused with
//! a 401 is sent once more with the answer to the registry's challenge (`super::auth`).

use bytes::Bytes;
use reqwest::header::{
    HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, LOCATION,
    WWW_AUTHENTICATE,
};
use reqwest::{RequestBuilder, Response, StatusCode, Url};
use serde::Deserialize;

use super::auth::Auth;
use super::config::{DOCKER_MANIFEST, DOCKER_MANIFEST_LIST, MEDIA_INDEX, MEDIA_MANIFEST};
use super::constants::{CONNECT_TIMEOUT, MAX_QUOTED_BODY, REQUEST_TIMEOUT};
use super::digest::Digest;
use super::error::{chain, ImageError};
use super::reference::Reference;

/// The header in which registries return a manifest's digest.
const CONTENT_DIGEST: &str = "docker-content-digest";

/// One repository of one registry.
pub struct Registry {
    http: reqwest::Client,
    /// `http(s)://host[:port]`.
    base: Url,
    /// The registry as the user wrote it, for messages.
    host: String,
    repository: String,
    auth: Auth,
}

impl Registry {
    /// A client for `reference`'s repository: plain HTTP when `plain_http`, else HTTPS;
    /// credentials from the docker config file.
    pub fn new(reference: &Reference, plain_http: bool) -> Result<Registry, ImageError> {
        let scheme = if plain_http { "http" } else { "https" };
        let base = Url::parse(&format!("{scheme}://{}", reference.api_host())).map_err(|e| {
            ImageError::BadReference {
                reference: reference.to_string(),
                reason: e.to_string(),
            }
        })?;
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("tether/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ImageError::Network {
                registry: reference.registry.clone(),
                cause: chain(&e),
                hint: String::new(),
            })?;
        Ok(Registry {
            http,
            base,
            host: reference.registry.clone(),
            repository: reference.repository.clone(),
            auth: Auth::new(&reference.registry, &reference.repository)?,
        })
    }

    /// Checks that the registry answers and accepts us (authenticating if it asks), so that
    /// a wrong address or password fails before any upload.
    pub(crate) async fn ping(&self) -> Result<(), ImageError> {
        let url = self.url("/v2/");
        let response = self
            .send("the API check", || self.http.get(url.clone()))
            .await?;
        self.expect(response, "the API check", &[StatusCode::OK])
            .await
            .map(drop)
    }

    /// Whether the repository already has the blob `digest`.
    pub(crate) async fn has_blob(&self, digest: &Digest) -> Result<bool, ImageError> {
        let url = self.url(&format!("/v2/{}/blobs/{digest}", self.repository));
        let response = self
            .send("a blob check", || self.http.head(url.clone()))
            .await?;
        match response.status() {
            StatusCode::OK => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => self
                .expect(response, &format!("the check of blob {digest}"), &[])
                .await
                .map(|_| false),
        }
    }

    /// Starts an upload; returns where to send its bytes.
    pub(crate) async fn start_upload(&self, digest: &Digest) -> Result<Url, ImageError> {
        let url = self.url(&format!("/v2/{}/blobs/uploads/", self.repository));
        let what = format!("the upload of blob {digest}");
        let response = self
            .send(&what, || {
                self.http.post(url.clone()).header(CONTENT_LENGTH, 0)
            })
            .await?;
        let response = self
            .expect(response, &what, &[StatusCode::ACCEPTED])
            .await?;
        self.location(&response, &what)
    }

    /// Sends the bytes at `offset` of an upload in progress; returns where to send the next.
    pub(crate) async fn upload_chunk(
        &self,
        at: &Url,
        offset: u64,
        chunk: Bytes,
        digest: &Digest,
    ) -> Result<Url, ImageError> {
        let what = format!("the upload of blob {digest}");
        let range = format!("{offset}-{}", offset + chunk.len() as u64 - 1);
        let response = self
            .send(&what, || {
                self.http
                    .patch(at.clone())
                    .header(CONTENT_TYPE, "application/octet-stream")
                    .header(CONTENT_RANGE, range.clone())
                    .body(chunk.clone())
            })
            .await?;
        let response = self
            .expect(response, &what, &[StatusCode::ACCEPTED])
            .await?;
        self.location(&response, &what)
    }

    /// Completes an upload, with its last (or only) bytes.
    pub(crate) async fn finish_upload(
        &self,
        at: &Url,
        digest: &Digest,
        last: Bytes,
    ) -> Result<(), ImageError> {
        let what = format!("the upload of blob {digest}");
        let mut url = at.clone();
        url.query_pairs_mut().append_pair("digest", digest.as_str());
        let response = self
            .send(&what, || {
                self.http
                    .put(url.clone())
                    .header(CONTENT_TYPE, "application/octet-stream")
                    .body(last.clone())
            })
            .await?;
        self.expect(response, &what, &[StatusCode::CREATED])
            .await
            .map(drop)
    }

    /// Stores a manifest under `target` (a tag or its digest); returns the digest the
    /// registry reports.
    pub(crate) async fn put_manifest(
        &self,
        target: &str,
        media_type: &str,
        body: Bytes,
    ) -> Result<Option<String>, ImageError> {
        let url = self.url(&format!("/v2/{}/manifests/{target}", self.repository));
        let what = format!("the manifest for {target}");
        let response = self
            .send(&what, || {
                self.http
                    .put(url.clone())
                    .header(CONTENT_TYPE, media_type)
                    .body(body.clone())
            })
            .await?;
        let response = self.expect(response, &what, &[StatusCode::CREATED]).await?;
        Ok(response
            .headers()
            .get(CONTENT_DIGEST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string))
    }

    /// Fetches the manifest (or index) under `target` (a tag or digest), accepting the OCI
    /// and Docker forms; returns its bytes and media type.
    pub async fn get_manifest(&self, target: &str) -> Result<(Bytes, String), ImageError> {
        let url = self.url(&format!("/v2/{}/manifests/{target}", self.repository));
        let what = format!("the manifest for {target}");
        let accept = [
            MEDIA_INDEX,
            MEDIA_MANIFEST,
            DOCKER_MANIFEST_LIST,
            DOCKER_MANIFEST,
        ]
        .join(", ");
        let response = self
            .send(&what, || {
                self.http.get(url.clone()).header(ACCEPT, accept.clone())
            })
            .await?;
        let response = self.expect(response, &what, &[StatusCode::OK]).await?;
        let media_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_string())
            .unwrap_or_default();
        let body = response.bytes().await.map_err(|e| self.network(e))?;
        Ok((body, media_type))
    }

    /// Starts downloading the blob `digest`; the response streams its bytes.
    pub async fn get_blob(&self, digest: &Digest) -> Result<Response, ImageError> {
        let url = self.url(&format!("/v2/{}/blobs/{digest}", self.repository));
        let what = format!("the download of blob {digest}");
        let response = self.send(&what, || self.http.get(url.clone())).await?;
        self.expect(response, &what, &[StatusCode::OK]).await
    }

    /// The error for a failed read of a response body.
    pub fn read_failed(&self, source: reqwest::Error) -> ImageError {
        self.network(source)
    }

    fn url(&self, path: &str) -> Url {
        self.base.join(path).expect("registry paths are valid")
    }

    /// The upload URL a response names (relative URLs are resolved against the registry).
    fn location(&self, response: &Response, what: &str) -> Result<Url, ImageError> {
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok());
        location
            .and_then(|l| self.base.join(l).ok())
            .ok_or_else(|| ImageError::Registry {
                registry: self.host.clone(),
                what: what.to_string(),
                status: response.status().as_u16(),
                message: ": the response has no upload location".into(),
            })
    }

    /// Sends the request `build` makes, with the current authorization; on a 401, answers
    /// the challenge and sends it once more.
    async fn send(
        &self,
        what: &str,
        build: impl Fn() -> RequestBuilder,
    ) -> Result<Response, ImageError> {
        let current = self.auth.current().await;
        let response = self.dispatch(build(), current.as_ref()).await?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        let challenge = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .unwrap_or_default();
        let auth = self.auth.answer(&self.http, &challenge).await?;
        let response = self.dispatch(build(), Some(&auth)).await?;
        if response.status() == StatusCode::UNAUTHORIZED
            || response.status() == StatusCode::FORBIDDEN
        {
            return Err(self.auth.refused(&format!(
                "{what} was refused with HTTP {}",
                response.status().as_u16()
            )));
        }
        self.auth.remember(auth).await;
        Ok(response)
    }

    async fn dispatch(
        &self,
        request: RequestBuilder,
        auth: Option<&HeaderValue>,
    ) -> Result<Response, ImageError> {
        let request = match auth {
            Some(a) => request.header(AUTHORIZATION, a.clone()),
            None => request,
        };
        request.send().await.map_err(|source| self.network(source))
    }

    /// Fails unless `response` has one of `ok` statuses, quoting the registry's errors.
    async fn expect(
        &self,
        response: Response,
        what: &str,
        ok: &[StatusCode],
    ) -> Result<Response, ImageError> {
        let status = response.status();
        if ok.contains(&status) {
            return Ok(response);
        }
        let body = response.text().await.unwrap_or_default();
        Err(ImageError::Registry {
            registry: self.host.clone(),
            what: what.to_string(),
            status: status.as_u16(),
            message: registry_message(&body),
        })
    }

    fn network(&self, source: reqwest::Error) -> ImageError {
        let plain = self.base.scheme() == "http";
        let hint = if source.is_connect() && !plain {
            "; if it serves plain HTTP, pass --insecure".into()
        } else if source.is_connect() {
            "; is the registry running?".into()
        } else {
            String::new()
        };
        ImageError::Network {
            registry: self.host.clone(),
            cause: chain(&source),
            hint,
        }
    }
}

/// `{"errors":[{"code":"…","message":"…"}]}` → `: CODE message; …`, else the body's start.
fn registry_message(body: &str) -> String {
    #[derive(Deserialize)]
    struct Errors {
        errors: Vec<Error>,
    }
    #[derive(Deserialize)]
    struct Error {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    if let Ok(errors) = serde_json::from_str::<Errors>(body) {
        let parts: Vec<String> = errors
            .errors
            .iter()
            .map(|e| format!("{} {}", e.code, e.message).trim().to_string())
            .collect();
        if !parts.is_empty() {
            return format!(": {}", parts.join("; "));
        }
    }
    let body = body.trim();
    if body.is_empty() {
        return String::new();
    }
    let mut end = body.len().min(MAX_QUOTED_BODY);
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    format!(": {}", &body[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_errors_are_quoted() {
        let body = r#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown to registry"}]}"#;
        assert_eq!(
            registry_message(body),
            ": BLOB_UNKNOWN blob unknown to registry"
        );
        assert_eq!(registry_message(""), "");
        assert_eq!(registry_message("nope"), ": nope");
    }
}
