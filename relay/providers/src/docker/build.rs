//! `tether image build --target docker --name NAME`: builds the OCI image here (the base
//! plus the static agent as its entrypoint, as `--target oci` does), loads it into the engine
//! (`POST /images/load`, which Docker 25+ and Podman take as an OCI archive) and tags it
//! NAME, which `tether create --provider docker --image NAME` then runs. The engine is the
//! relay's: `DOCKER_HOST`, else the default socket.

use bollard::query_parameters::{ImportImageOptions, RemoveImageOptions, TagImageOptions};
use bollard::Docker;
use futures_util::StreamExt;
use tether_oci::{BuildOptions, Built};

use super::engine::{self, Host};
use crate::image::{Event, RemoteBuild, RemoteBuilt, TargetError};

const PROVIDER: &str = "docker";
/// The start of the temporary tag an image is loaded under.
const LOAD_TAG_PREFIX: &str = "tether-load-";

/// Builds `req` and loads it into the engine as `req.name`.
pub(crate) async fn build(
    req: &RemoteBuild,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<RemoteBuilt, TargetError> {
    if req.from.is_some() {
        return Err(TargetError::Usage(
            "--from is not taken by --target docker: pull the base first (`tether image pull \
             REFERENCE DIR`) and pass --base DIR"
                .into(),
        ));
    }
    if req.push.is_some() {
        return Err(TargetError::Usage(
            "--push is not taken by --target docker, which loads the image into the engine; \
             to share it through a registry, build with --target oci and `tether image push`"
                .into(),
        ));
    }
    let (repo, tag) = split_name(&req.name)?;
    let host = Host::resolve(None).map_err(TargetError::Settings)?;
    let docker = host
        .client()
        .map_err(|e| TargetError::Settings(e.to_string()))?;

    events(Event::Step("building the image".into()));
    let dir = tempfile::tempdir().map_err(|e| api(format!("making a temporary directory: {e}")))?;
    // The engine names a loaded OCI archive after its tag (Podman: `localhost/TAG:latest`):
    // a name of our own that no user image has, removed once the image is tagged NAME.
    let load_tag = format!("{LOAD_TAG_PREFIX}{:016x}", rand::random::<u64>());
    let opts = BuildOptions {
        base: req.base.clone(),
        agent: req.agent.clone(),
        output: dir.path().join("image.tar"),
        tag: load_tag.clone(),
        overrides: req.overrides.clone(),
        epoch: req.epoch,
    };
    let built = tokio::task::spawn_blocking(move || tether_oci::build(&opts, &|_| {}))
        .await
        .map_err(|e| api(format!("the build stopped unexpectedly: {e}")))??;

    events(Event::Step(format!(
        "loading it into the engine at {}",
        host.socket.display()
    )));
    let loaded = load(&docker, &host, &built, events).await?;
    let options = TagImageOptions {
        repo: Some(repo),
        tag: Some(tag),
    };
    docker
        .tag_image(&loaded, Some(options))
        .await
        .map_err(|e| api(host.error("tagging the loaded image", e).to_string()))?;
    untag_load_names(&docker, &req.name, &load_tag).await;
    let id = docker
        .inspect_image(&req.name)
        .await
        .map_err(|e| api(host.error("looking up the tagged image", e).to_string()))?
        .id
        .unwrap_or_else(|| built.config.as_str().to_string());
    Ok(RemoteBuilt {
        provider: PROVIDER,
        name: req.name.clone(),
        id,
        build_id: Some(built.digest.as_str().to_string()),
    })
}

/// Loads the tarball; returns how the engine now names the image.
async fn load(
    docker: &Docker,
    host: &Host,
    built: &Built,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<String, TargetError> {
    let file = tokio::fs::File::open(&built.output)
        .await
        .map_err(|e| api(format!("reading {}: {e}", built.output.display())))?;
    let body = bollard::body_try_stream(tokio_util::io::ReaderStream::new(file));
    let mut stream = docker.import_image(ImportImageOptions::default(), body, None);
    while let Some(item) = stream.next().await {
        let info = item.map_err(|e| api(host.error("loading the image", e).to_string()))?;
        for line in [info.stream, info.status].into_iter().flatten() {
            if !line.trim().is_empty() {
                events(Event::Log(line.trim_end().to_string()));
            }
        }
    }
    // The engine's id of an image is its config's digest (Podman, Docker's own store) or its
    // manifest's (Docker's containerd store): whichever it knows.
    for candidate in [built.config.as_str(), built.digest.as_str()] {
        match docker.inspect_image(candidate).await {
            Ok(_) => return Ok(candidate.to_string()),
            Err(e) if engine::status(&e) == Some(404) => continue,
            Err(e) => return Err(api(host.error("finding the loaded image", e).to_string())),
        }
    }
    Err(api(format!(
        "the engine accepted the image but knows it neither as {} nor as {}; it may not take \
         OCI archives (Docker before 25 does not)",
        built.config.as_str(),
        built.digest.as_str()
    )))
}

/// Removes the names the load gave the image (those holding `load_tag`), never NAME: an
/// untag only, since NAME still holds the image. A failure is logged and leaves a name behind.
async fn untag_load_names(docker: &Docker, name: &str, load_tag: &str) {
    let tags = match docker.inspect_image(name).await {
        Ok(image) => image.repo_tags.unwrap_or_default(),
        Err(e) => {
            tracing::warn!("cannot list the names of {name}: {e}");
            return;
        }
    };
    for tag in tags.iter().filter(|t| t.contains(load_tag)) {
        let options = RemoveImageOptions {
            noprune: true,
            ..Default::default()
        };
        if let Err(e) = docker.remove_image(tag, Some(options), None).await {
            tracing::warn!("cannot remove the temporary name {tag} of {name}: {e}");
        }
    }
}

/// `registry/name:tag` → (`registry/name`, `tag`); the tag defaults to `latest`.
fn split_name(name: &str) -> Result<(String, String), TargetError> {
    let bad = |why: &str| {
        TargetError::Usage(format!(
            "--name {name:?} is not an image name the engine takes ({why}): give NAME[:TAG], \
             e.g. tether-sandbox:v1"
        ))
    };
    if name.is_empty() || name.contains('@') {
        return Err(bad("empty, or a digest"));
    }
    let last = name.rsplit('/').next().unwrap_or(name);
    let (repo, tag) = match last.rsplit_once(':') {
        Some((_, tag)) => (&name[..name.len() - tag.len() - 1], tag),
        None => (name, "latest"),
    };
    let repo_ok = repo.bytes().all(|b| {
        b.is_ascii_lowercase()
            || b.is_ascii_digit()
            || matches!(b, b'.' | b'_' | b'-' | b'/' | b':')
    });
    let tag_ok = !tag.is_empty()
        && tag.len() <= 128
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if repo.is_empty() || !repo_ok || !tag_ok {
        return Err(bad(
            "lower-case letters, digits, '.', '_', '-' and '/' only",
        ));
    }
    Ok((repo.to_string(), tag.to_string()))
}

fn api(message: String) -> TargetError {
    TargetError::Api {
        provider: PROVIDER,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_into_repository_and_tag() {
        let ok = |n: &str| split_name(n).unwrap();
        assert_eq!(ok("sandbox"), ("sandbox".into(), "latest".into()));
        assert_eq!(ok("sandbox:v1"), ("sandbox".into(), "v1".into()));
        assert_eq!(
            ok("localhost:5000/team/sandbox:v1"),
            ("localhost:5000/team/sandbox".into(), "v1".into())
        );
        assert_eq!(
            ok("localhost:5000/sandbox"),
            ("localhost:5000/sandbox".into(), "latest".into())
        );
        for bad in ["", "Sandbox", "sb@sha256:00", "sb:", "sb:a b", "sb:tag!"] {
            assert!(split_name(bad).is_err(), "{bad}");
        }
    }
}
