//! The fake's Modal images: `ImageGetOrCreate` (one image id per definition, as Modal
//! deduplicates them), builds in the background with their log (`ImageJoinStreaming`, which
//! resumes after `last_entry_id`), names (`ImagePublish`, `ImageGetByTag`), and the file
//! system a sandbox of an image runs on.
//!
//! A definition that is only `FROM <tag>` (the SDK's `Image.from_registry`, and what Tether's
//! provider sends for a registry `--image`) is not pulled, since the fake has no internet: it
//! "builds" at once, and its sandboxes run on the fake's default file system. It is pulled
//! when a later definition builds on it (`FROM base`). Any other definition is built for real
//! by [`crate::dockerfile`]: its base is pulled from the (local) registry it names, and its
//! `COPY` commands take files from its context mount (`context_mount_id`, [`super::mounts`])
//! or its inline `context_files`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::Stream;
use prost::Message;
use tether_oci::digest::Digest;
use tonic::Status;

use super::pb::generic_result::GenericStatus;
use super::pb::*;
use super::service::{long_poll, Service, BASE62};
use super::{result, Modal};
use crate::dockerfile::{self as build, ContextEntry, Inputs};
use crate::sandboxes::random_id;

/// The environment a name without one is published in (what `EnvironmentGetOrCreate` calls
/// the default).
const DEFAULT_ENVIRONMENT: &str = "main";
/// The tag of a name given without one.
const DEFAULT_TAG: &str = "latest";

/// The stream `ImageJoinStreaming` answers with.
pub(super) type JoinStream =
    Pin<Box<dyn Stream<Item = Result<ImageJoinStreamingResponse, Status>> + Send>>;

/// Every image of the fake.
#[derive(Default)]
pub(super) struct ImageTable {
    /// Digest of a definition → its image id.
    by_definition: HashMap<String, String>,
    builds: HashMap<String, Build>,
    /// `environment/name:tag` → image id.
    tags: HashMap<String, String>,
}

/// One image and its build.
struct Build {
    /// The build log, one entry per line; entry ids count from 1.
    log: Vec<String>,
    /// Set when the build has ended.
    result: Option<GenericResult>,
    /// What the image is, once built.
    contents: Option<Contents>,
}

/// What a built image holds.
#[derive(Clone)]
enum Contents {
    /// Only a registry tag, never pulled.
    Tag(String),
    /// An OCI image layout in the fake's image store.
    Layout(PathBuf),
}

/// The file system of image `image_id` for a sandbox: `None` for the fake's default one.
pub(super) fn sandbox_root(fake: &Modal, image_id: &str) -> Result<Option<PathBuf>, Status> {
    let table = fake.images.lock().expect("image table");
    let build = table
        .builds
        .get(image_id)
        .ok_or_else(|| Status::not_found(format!("Image {image_id} not found")))?;
    match (&build.result, &build.contents) {
        (Some(_), Some(Contents::Layout(dir))) => Ok(Some(dir.clone())),
        (Some(_), Some(Contents::Tag(_))) => Ok(None),
        _ => Err(Status::failed_precondition(format!(
            "Image {image_id} has not been built successfully"
        ))),
    }
}

impl Service {
    /// `ImageGetOrCreate`: the definition's image, building it if it is new (or failed).
    pub(super) fn image_get_or_create_in(
        &self,
        req: ImageGetOrCreateRequest,
    ) -> Result<ImageGetOrCreateResponse, Status> {
        let fake = &self.0;
        let image = req
            .image
            .ok_or_else(|| Status::invalid_argument("image is required"))?;
        let context = match image.context_mount_id.as_str() {
            "" => HashMap::new(),
            id => fake
                .mounts
                .lock()
                .expect("mount table")
                .context(id)
                .ok_or_else(|| Status::not_found(format!("Mount {id} not found")))?,
        };
        let key = Digest::of(&image.encode_to_vec()).to_string();
        let mut table = fake.images.lock().expect("image table");
        if let Some(id) = table.by_definition.get(&key) {
            let build = &table.builds[id];
            let failed = build
                .result
                .as_ref()
                .is_some_and(|r| r.status != GenericStatus::Success as i32);
            if !failed {
                return Ok(ImageGetOrCreateResponse {
                    image_id: id.clone(),
                    result: build.result.clone(),
                });
            }
        }
        let only_tag = match image.dockerfile_commands.as_slice() {
            [from]
                if image.base_images.is_empty()
                    && image.context_files.is_empty()
                    && context.is_empty() =>
            {
                from.trim()
                    .strip_prefix("FROM ")
                    .map(|tag| tag.trim().to_string())
            }
            _ => None,
        };
        let bases = image
            .base_images
            .iter()
            .map(|b| {
                let contents = table
                    .builds
                    .get(&b.image_id)
                    .filter(|b| b.result.is_some())
                    .and_then(|b| b.contents.clone())
                    .ok_or_else(|| {
                        Status::not_found(format!("base image {} not found", b.image_id))
                    })?;
                Ok((b.docker_tag.clone(), contents))
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let image_id = format!("im-{}", random_id(22, BASE62));
        table.by_definition.insert(key, image_id.clone());
        let mut build = Build {
            log: vec![format!("Building image {image_id}")],
            result: None,
            contents: None,
        };
        if let Some(tag) = only_tag {
            build.log.push(format!("=> Step 0: FROM {tag}"));
            build.log.push(format!("Built image {image_id}"));
            build.result = Some(result(GenericStatus::Success, 0, ""));
            build.contents = Some(Contents::Tag(tag));
            table.builds.insert(image_id.clone(), build);
        } else {
            table.builds.insert(image_id.clone(), build);
            tokio::spawn(run_build(
                fake.clone(),
                image_id.clone(),
                image,
                bases,
                context,
            ));
        }
        // New: the client waits on ImageJoinStreaming, as with a real build.
        Ok(ImageGetOrCreateResponse {
            image_id,
            result: None,
        })
    }

    /// `ImageJoinStreaming`: the log after `last_entry_id`, then the result; the stream ends
    /// without one when the long poll's time is up, for the client to join again.
    pub(super) fn image_join(&self, req: ImageJoinStreamingRequest) -> Result<JoinStream, Status> {
        let fake = self.0.clone();
        if !fake
            .images
            .lock()
            .expect("image table")
            .builds
            .contains_key(&req.image_id)
        {
            return Err(Status::not_found(format!(
                "Image {} not found",
                req.image_id
            )));
        }
        struct Cursor {
            fake: Arc<Modal>,
            image_id: String,
            next: usize,
            deadline: tokio::time::Instant,
            changes: tokio::sync::watch::Receiver<()>,
            done: bool,
        }
        let cursor = Cursor {
            changes: fake.image_changes.subscribe(),
            fake,
            image_id: req.image_id,
            next: req.last_entry_id.parse().unwrap_or(0),
            deadline: tokio::time::Instant::now() + long_poll(req.timeout),
            done: false,
        };
        let stream = futures_util::stream::unfold(cursor, |mut c| async move {
            if c.done {
                return None;
            }
            loop {
                let (line, result) = {
                    let table = c.fake.images.lock().expect("image table");
                    let build = table.builds.get(&c.image_id)?;
                    (build.log.get(c.next).cloned(), build.result.clone())
                };
                if let Some(line) = line {
                    c.next += 1;
                    let msg = ImageJoinStreamingResponse {
                        result: None,
                        task_logs: vec![TaskLogs {
                            data: format!("{line}\n"),
                        }],
                        entry_id: c.next.to_string(),
                        eof: false,
                    };
                    return Some((Ok(msg), c));
                }
                if let Some(result) = result {
                    c.done = true;
                    let msg = ImageJoinStreamingResponse {
                        result: Some(result),
                        task_logs: vec![],
                        entry_id: c.next.to_string(),
                        eof: true,
                    };
                    return Some((Ok(msg), c));
                }
                match tokio::time::timeout_at(c.deadline, c.changes.changed()).await {
                    Ok(Ok(())) => continue,
                    _ => return None,
                }
            }
        });
        Ok(Box::pin(stream))
    }

    /// `ImagePublish`: names a built image.
    pub(super) fn image_publish_in(
        &self,
        req: ImagePublishRequest,
    ) -> Result<ImagePublishResponse, Status> {
        let key = tag_key(&req.tag, &req.environment_name)?;
        let mut table = self.0.images.lock().expect("image table");
        let built = table
            .builds
            .get(&req.image_id)
            .ok_or_else(|| Status::not_found(format!("Image {} not found", req.image_id)))?;
        if built.result.as_ref().map(|r| r.status) != Some(GenericStatus::Success as i32) {
            return Err(Status::failed_precondition(format!(
                "Image {} has not been built successfully and cannot be published",
                req.image_id
            )));
        }
        table.tags.insert(key, req.image_id.clone());
        Ok(ImagePublishResponse {
            image_id: req.image_id,
            revision_id: format!("ir-{}", random_id(26, BASE62)),
        })
    }

    /// `ImageGetByTag`: the image published under a name.
    pub(super) fn image_get_by_tag_in(
        &self,
        req: ImageGetByTagRequest,
    ) -> Result<ImageGetByTagResponse, Status> {
        let key = tag_key(&req.tag, &req.environment_name)?;
        let table = self.0.images.lock().expect("image table");
        let image_id = table
            .tags
            .get(&key)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("Image '{}' not found", req.tag)))?;
        Ok(ImageGetByTagResponse { image_id })
    }
}

/// `[environment/]name[:tag]` (environment else `environment_name`, else the default) as
/// `environment/name:tag`.
fn tag_key(tag: &str, environment_name: &str) -> Result<String, Status> {
    let (path, version) = tag.split_once(':').unwrap_or((tag, DEFAULT_TAG));
    let (environment, name) = match path.rsplit_once('/') {
        Some((environment, name)) => (environment, name),
        None if environment_name.is_empty() => (DEFAULT_ENVIRONMENT, path),
        None => (environment_name, path),
    };
    if name.is_empty() || version.is_empty() || environment.is_empty() {
        return Err(Status::invalid_argument(format!(
            "Invalid Image name: '{tag}'"
        )));
    }
    Ok(format!("{environment}/{name}:{version}"))
}

/// Runs the build of `image_id` with `context` (its mount's files; inline context files are
/// added), logging as it goes, and records how it ended.
async fn run_build(
    fake: Arc<Modal>,
    image_id: String,
    image: Image,
    bases: Vec<(String, Contents)>,
    mut context: HashMap<String, ContextEntry>,
) {
    let log = |line: String| {
        if let Some(build) = fake
            .images
            .lock()
            .expect("image table")
            .builds
            .get_mut(&image_id)
        {
            build.log.push(line);
        }
        fake.image_changes.send_replace(());
    };
    let outcome = async {
        let mut layouts = HashMap::new();
        for (docker_tag, contents) in bases {
            let layout = match contents {
                Contents::Layout(dir) => dir,
                Contents::Tag(tag) => fake.store.pull(&tag).await?,
            };
            layouts.insert(docker_tag, layout);
        }
        for file in image.context_files {
            let entry = ContextEntry {
                data: file.data.into(),
                mode: None,
            };
            context.insert(file.filename, entry);
        }
        let inputs = Inputs {
            bases: layouts,
            context,
        };
        build::run(&fake.store, &image.dockerfile_commands, inputs, &log).await
    }
    .await;
    let (status, contents, exception) = match outcome {
        Ok(layout) => {
            log(format!("Built image {image_id}"));
            (
                GenericStatus::Success,
                Some(Contents::Layout(layout)),
                String::new(),
            )
        }
        Err(e) => {
            let exception = format!("{e:#}");
            log(format!("Image build failed: {exception}"));
            (GenericStatus::Failure, None, exception)
        }
    };
    if let Some(build) = fake
        .images
        .lock()
        .expect("image table")
        .builds
        .get_mut(&image_id)
    {
        build.result = Some(result(status, 0, &exception));
        build.contents = contents;
    }
    fake.image_changes.send_replace(());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandboxes::Sandboxes;
    use futures_util::StreamExt;

    #[tokio::test]
    async fn the_build_log_resumes_after_the_last_entry_id() {
        let dir = tempfile::tempdir().unwrap();
        let sandboxes = Arc::new(Sandboxes::new(dir.path().into(), "/nonexistent".into()));
        let config = super::super::Config::new("ak", "as");
        let service = Service(Modal::new(config, sandboxes));
        let image = Image {
            dockerfile_commands: vec!["FROM alpine:3.21".into()],
            ..Image::default()
        };
        let request = ImageGetOrCreateRequest {
            image: Some(image),
            ..ImageGetOrCreateRequest::default()
        };
        let first = service.image_get_or_create_in(request.clone()).unwrap();
        assert!(
            first.result.is_none(),
            "a new image is reported as building"
        );
        let join = ImageJoinStreamingRequest {
            image_id: first.image_id.clone(),
            timeout: 1.0,
            last_entry_id: "1".into(),
        };
        let answers: Vec<_> = service.image_join(join).unwrap().collect().await;
        let answers: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
        // Entry 1 ("Building image ...") was seen already.
        assert_eq!(
            answers[0].task_logs[0].data,
            "=> Step 0: FROM alpine:3.21\n"
        );
        assert_eq!(answers[0].entry_id, "2");
        let last = answers.last().unwrap();
        assert!(last.eof);
        assert_eq!(
            last.result.as_ref().unwrap().status,
            GenericStatus::Success as i32
        );
        // The same definition again: the same image, built already.
        let again = service.image_get_or_create_in(request).unwrap();
        assert_eq!(again.image_id, first.image_id);
        assert!(again.result.is_some());
    }

    #[test]
    fn names_are_keyed_with_their_environment_and_tag() {
        assert_eq!(tag_key("sandbox", "").unwrap(), "main/sandbox:latest");
        assert_eq!(tag_key("sandbox:v1", "dev").unwrap(), "dev/sandbox:v1");
        assert_eq!(tag_key("dev/sandbox:v1", "").unwrap(), "dev/sandbox:v1");
        assert!(tag_key("dev/:v1", "").is_err());
    }
}
