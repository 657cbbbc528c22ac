//! Modal images: building one (its context files as a mount, [`super::mount`];
//! `ImageGetOrCreate`, then `ImageJoinStreaming` while Modal builds it, as the SDKs do),
//! publishing it under a name (`ImagePublish`), and resolving a
//! sandbox's `--image` (a published name through `ImageGetByTag`, else a registry tag built
//! as `FROM <tag>`, which is Modal's `Image.from_registry`).

use std::time::{Duration, Instant};

use tonic::Code;

use super::client::Modal;
use super::mount::{self, ContextFile};
use super::names::ImageName;
use super::pb;
use super::pb::generic_result::GenericStatus;
use tether_relay_core::provider::ProviderError;

/// How long an image may take to build.
pub(crate) const IMAGE_BUILD_TIMEOUT: Duration = Duration::from_secs(900);
/// The server-side wait of one `ImageJoinStreaming` call, in seconds (as the SDKs ask).
const LONG_POLL_SECS: f32 = 55.0;

/// What to build: Dockerfile commands, and the files their `COPY` commands name.
#[derive(Clone, Debug, Default)]
pub(crate) struct Definition {
    /// `FROM ...` first, then one Dockerfile instruction each.
    pub(crate) commands: Vec<String>,
    /// The build context: sent as a mount (never inline, whatever their size).
    pub(crate) files: Vec<ContextFile>,
}

/// Why an image was not built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BuildError {
    /// Modal ran the build and it did not succeed.
    #[error("Modal could not build image {image_id} ({status}): {exception}")]
    Failed {
        /// The image.
        image_id: String,
        /// How it ended, as Modal names it.
        status: String,
        /// Modal's explanation (the build's error).
        exception: String,
    },
    /// The build did not end in time.
    #[error("Modal is still building image {image_id} after {waited:?}")]
    TimedOut {
        /// The image.
        image_id: String,
        /// How long we waited.
        waited: Duration,
    },
    /// A call failed.
    #[error(transparent)]
    Call(#[from] ProviderError),
}

/// Builds `definition` in app `app_id` (or finds it built), passing each line of the build
/// log to `on_log`; returns the image id.
pub(super) async fn build(
    modal: &Modal,
    http: &reqwest::Client,
    app_id: &str,
    builder_version: &str,
    definition: Definition,
    on_log: &(dyn Fn(String) + Send + Sync),
) -> Result<String, BuildError> {
    let context_mount_id = match definition.files.as_slice() {
        [] => String::new(),
        files => mount::create(modal, http, app_id, files).await?,
    };
    let req = pb::ImageGetOrCreateRequest {
        image: Some(pb::Image {
            base_images: vec![],
            dockerfile_commands: definition.commands,
            context_files: vec![],
            context_mount_id,
        }),
        app_id: app_id.to_string(),
        builder_version: builder_version.to_string(),
    };
    let answer = modal
        .call("ImageGetOrCreate", req, |mut c, r| async move {
            c.image_get_or_create(r).await
        })
        .await
        .map_err(ProviderError::from)?;
    let image_id = answer.image_id;
    let mut result = answer.result.filter(is_final);
    let deadline = Instant::now() + IMAGE_BUILD_TIMEOUT;
    let mut last_entry_id = String::new();
    let mut log = LineBuffer::default();
    while result.is_none() {
        if Instant::now() > deadline {
            return Err(BuildError::TimedOut {
                image_id,
                waited: IMAGE_BUILD_TIMEOUT,
            });
        }
        // One long poll; when it ends without a result, join again after the last entry.
        let req = pb::ImageJoinStreamingRequest {
            image_id: image_id.clone(),
            timeout: LONG_POLL_SECS,
            last_entry_id: last_entry_id.clone(),
        };
        let mut stream = modal
            .call("ImageJoinStreaming", req, |mut c, r| async move {
                c.image_join_streaming(r).await
            })
            .await
            .map_err(ProviderError::from)?;
        loop {
            let msg = match stream.message().await {
                Ok(Some(msg)) => msg,
                Ok(None) => break,
                // A dropped stream is joined again; Modal keeps the log by entry id.
                Err(status) if status.code() == Code::Unavailable => break,
                Err(status) => {
                    return Err(BuildError::Call(ProviderError::Other(anyhow::anyhow!(
                        "Modal's log stream of image {image_id} failed: {status}"
                    ))))
                }
            };
            if !msg.entry_id.is_empty() {
                last_entry_id = msg.entry_id;
            }
            for entry in msg.task_logs {
                log.push(&entry.data, on_log);
            }
            if let Some(r) = msg.result.filter(is_final) {
                result = Some(r);
                break;
            }
            if msg.eof {
                break;
            }
        }
    }
    log.flush(on_log);
    let r = result.expect("the loop ends only with a result");
    if r.status == GenericStatus::Success as i32 {
        return Ok(image_id);
    }
    let status = GenericStatus::try_from(r.status)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("GENERIC_STATUS_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| format!("status {}", r.status));
    Err(BuildError::Failed {
        image_id,
        status,
        exception: r.exception,
    })
}

/// Publishes image `image_id` as `name` (in `environment` unless the name has its own);
/// returns the tag Modal now resolves.
pub(super) async fn publish(
    modal: &Modal,
    environment: &str,
    image_id: &str,
    name: &ImageName,
) -> Result<String, ProviderError> {
    let tag = name.wire(environment);
    let req = pb::ImagePublishRequest {
        image_id: image_id.to_string(),
        tag: tag.clone(),
        environment_name: String::new(),
        allow_public: false,
    };
    modal
        .call("ImagePublish", req, |mut c, r| async move {
            c.image_publish(r).await
        })
        .await?;
    Ok(tag)
}

/// The image a sandbox's `--image` names: an image published under that name, else the
/// registry image of that tag, built if Modal has not built it yet.
pub(super) async fn resolve(
    modal: &Modal,
    http: &reqwest::Client,
    app_id: &str,
    builder_version: &str,
    environment: &str,
    image: &str,
) -> Result<String, ProviderError> {
    let name = ImageName::parse(image).ok();
    if let Some(name) = &name {
        let req = pb::ImageGetByTagRequest {
            tag: name.wire(environment),
            environment_name: String::new(),
        };
        match modal
            .call("ImageGetByTag", req, |mut c, r| async move {
                c.image_get_by_tag(r).await
            })
            .await
        {
            Ok(found) => return Ok(found.image_id),
            // No image by that name (or a name Modal reads differently): a registry tag.
            Err(e) if matches!(e.code(), Some(Code::NotFound | Code::InvalidArgument)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let definition = Definition {
        commands: vec![format!("FROM {image}")],
        files: vec![],
    };
    let quiet = |_line: String| {};
    build(modal, http, app_id, builder_version, definition, &quiet)
        .await
        .map_err(|e| match e {
            BuildError::Call(e) => e,
            BuildError::TimedOut { .. } => ProviderError::Other(anyhow::anyhow!(
                "{e}; try again later, or pass an image Modal has built already"
            )),
            BuildError::Failed { exception, .. } if name.is_some() => {
                ProviderError::InvalidSpec(format!(
                    "Modal could not use --image {image}: it is neither an image published on \
                     Modal under that name nor a registry image Modal can pull ({exception})"
                ))
            }
            BuildError::Failed { exception, .. } => ProviderError::InvalidSpec(format!(
                "Modal could not pull --image {image}: {exception}"
            )),
        })
}

/// A result that ends the wait: any status but UNSPECIFIED.
fn is_final(r: &pb::GenericResult) -> bool {
    r.status != GenericStatus::Unspecified as i32
}

/// Turns log chunks (which may hold several lines, or part of one) into lines.
#[derive(Default)]
struct LineBuffer {
    partial: String,
}

impl LineBuffer {
    fn push(&mut self, chunk: &str, on_line: &(dyn Fn(String) + Send + Sync)) {
        self.partial.push_str(chunk);
        while let Some(end) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=end).collect();
            on_line(line.trim_end_matches(['\r', '\n']).to_string());
        }
    }

    fn flush(&mut self, on_line: &(dyn Fn(String) + Send + Sync)) {
        if !self.partial.is_empty() {
            on_line(std::mem::take(&mut self.partial));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn log_chunks_become_lines() {
        let lines = Mutex::new(Vec::new());
        let collect = |l: String| lines.lock().unwrap().push(l);
        let mut buffer = LineBuffer::default();
        buffer.push("Step 1/3\nSte", &collect);
        buffer.push("p 2/3\r\n", &collect);
        buffer.push("done", &collect);
        buffer.flush(&collect);
        assert_eq!(*lines.lock().unwrap(), ["Step 1/3", "Step 2/3", "done"]);
    }
}
