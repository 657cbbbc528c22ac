//! Resolving `--image` to a Modal image: `ImageGetOrCreate` with `FROM <tag>` (what Modal's
//! `Image.from_registry` sends), then `ImageJoinStreaming` while Modal builds it.

use std::time::{Duration, Instant};

use anyhow::anyhow;

use super::client::Modal;
use super::pb;
use super::pb::generic_result::GenericStatus;
use crate::provider::ProviderError;

/// How long an image may take to build.
const IMAGE_BUILD_TIMEOUT: Duration = Duration::from_secs(900);
/// The server-side wait of one `ImageJoinStreaming` call, in seconds.
const LONG_POLL_SECS: f32 = 55.0;

/// The image `FROM tag`, built if Modal has not built it yet.
pub(super) async fn resolve(
    modal: &Modal,
    app_id: &str,
    builder_version: &str,
    tag: &str,
) -> Result<String, ProviderError> {
    let req = pb::ImageGetOrCreateRequest {
        image: Some(pb::Image {
            base_images: vec![],
            dockerfile_commands: vec![format!("FROM {tag}")],
        }),
        app_id: app_id.to_string(),
        builder_version: builder_version.to_string(),
    };
    let answer = modal
        .call("ImageGetOrCreate", req, |mut c, r| async move {
            c.image_get_or_create(r).await
        })
        .await?;
    let mut result = answer.result;
    let deadline = Instant::now() + IMAGE_BUILD_TIMEOUT;
    let mut last_entry_id = String::new();
    while result
        .as_ref()
        .is_none_or(|r| r.status == GenericStatus::Unspecified as i32)
    {
        if Instant::now() > deadline {
            return Err(ProviderError::Other(anyhow!(
                "Modal is still building image {tag} after {IMAGE_BUILD_TIMEOUT:?}"
            )));
        }
        let req = pb::ImageJoinStreamingRequest {
            image_id: answer.image_id.clone(),
            timeout: LONG_POLL_SECS,
            last_entry_id: last_entry_id.clone(),
        };
        let mut stream = modal
            .call("ImageJoinStreaming", req, |mut c, r| async move {
                c.image_join_streaming(r).await
            })
            .await?;
        loop {
            match stream.message().await {
                Ok(Some(msg)) => {
                    if !msg.entry_id.is_empty() {
                        last_entry_id = msg.entry_id;
                    }
                    if msg
                        .result
                        .as_ref()
                        .is_some_and(|r| r.status != GenericStatus::Unspecified as i32)
                    {
                        result = msg.result;
                        break;
                    }
                    if msg.eof {
                        break;
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    return Err(ProviderError::Other(anyhow!(
                        "Modal's image build stream failed: {status}"
                    )))
                }
            }
        }
    }
    match result {
        Some(r) if r.status == GenericStatus::Success as i32 => Ok(answer.image_id),
        Some(r) => Err(ProviderError::InvalidSpec(format!(
            "Modal could not build image {tag} (status {}): {}",
            r.status, r.exception
        ))),
        None => unreachable!("the loop ends only with a result"),
    }
}
