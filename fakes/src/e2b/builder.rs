//! The fake E2B's template builder: the base (`fromImage` pulled into the fake's image store,
//! or `fromTemplate`'s image), then the steps as E2B's builder applies them (COPY unpacks the
//! uploaded tar and puts its source at the destination, WORKDIR and USER change the run
//! settings, ENV the template's metadata), one new image in the store, and a log entry per
//! step. As with E2B, the variables (the base image's and the ENV steps') are the build's:
//! the ready command runs with them, a `fromTemplate` build starts from them, and no
//! sandbox's process gets them (the image keeps no `Env`). A failure ends the
//! build in `error` with E2B's `reason` (the message and the failed step: `base` or the
//! step's number).
//!
//! The fake has no VM to run build commands in, so a RUN step is refused when the build is
//! started and a start command is only logged; the ready command runs in a sandbox of the
//! new image ([`super::ready`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use serde::Deserialize;
use tether_oci::apply::{layer_reader, Applier};

use super::templates::{LogEntry, Lookup, Status};
use super::E2b;
use crate::images::{AddFile, ConfigEdit};

/// The layer media types the uploaded tars are read as: gzipped (the SDK's default) or not.
const GZIP_TAR: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const PLAIN_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// gzip's first two bytes.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// A COPY's owner when none is given, and relative paths' base: E2B's default user.
const DEFAULT_WORKDIR: &str = "/home/user";

/// `TemplateBuildStartV2`.
#[derive(Debug, Deserialize)]
pub(super) struct BuildStart {
    #[serde(rename = "fromImage", default)]
    from_image: Option<String>,
    #[serde(rename = "fromTemplate", default)]
    from_template: Option<String>,
    #[serde(rename = "fromImageRegistry", default)]
    from_image_registry: Option<serde_json::Value>,
    #[serde(default)]
    steps: Vec<Step>,
    #[serde(rename = "startCmd", default)]
    start_cmd: Option<String>,
    #[serde(rename = "readyCmd", default)]
    ready_cmd: Option<String>,
}

/// `TemplateStep`.
#[derive(Debug, Deserialize)]
struct Step {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(rename = "filesHash", default)]
    files_hash: Option<String>,
}

impl BuildStart {
    /// What E2B's API refuses at once (400), before the build starts.
    pub(super) fn check(&self) -> Result<(), String> {
        match (&self.from_image, &self.from_template) {
            (Some(_), Some(_)) => {
                return Err("cannot specify both fromImage and fromTemplate".into())
            }
            (None, None) => return Err("fromImage or fromTemplate is required".into()),
            _ => {}
        }
        if self.from_image_registry.is_some() {
            return Err("this fake E2B pulls without credentials: fromImageRegistry is not supported; use a registry that needs none".into());
        }
        for (i, step) in self.steps.iter().enumerate() {
            let n = i + 1;
            match step.kind.to_ascii_uppercase().as_str() {
                "COPY" if step.args.len() < 2 => {
                    return Err(format!(
                        "step {n}: COPY requires a local path and a container path argument"
                    ))
                }
                "COPY" if step.files_hash.as_deref().is_none_or(str::is_empty) => {
                    return Err(format!("step {n}: COPY requires files hash to be set"))
                }
                "ENV" if step.args.is_empty() || step.args.len() % 2 != 0 => {
                    return Err(format!("step {n}: ENV requires key and value pairs"))
                }
                "WORKDIR" | "USER" if step.args.len() != 1 => {
                    return Err(format!(
                        "step {n}: {} requires exactly one argument",
                        step.kind
                    ))
                }
                "COPY" | "ENV" | "WORKDIR" | "USER" => {}
                "RUN" => {
                    return Err(format!(
                    "step {n}: this fake E2B has no VM to run commands in, so it refuses RUN steps"
                ))
                }
                other => return Err(format!("step {n}: unsupported step type {other}")),
            }
        }
        Ok(())
    }
}

/// A build failure: the reason's message and step.
struct Failure {
    message: String,
    step: String,
}

fn fail(step: impl Into<String>, message: impl Into<String>) -> Failure {
    Failure {
        message: message.into(),
        step: step.into(),
    }
}

/// Runs the build `build_id` of template `template_id` to `ready` or `error`.
pub(super) async fn run(fake: Arc<E2b>, template_id: String, build_id: String, start: BuildStart) {
    let log = |level: &'static str, step: Option<&str>, message: String| {
        let mut table = fake.templates.lock().expect("template table");
        if let Some(build) = table.build_mut(&template_id, &build_id) {
            build.log.push(LogEntry {
                at: SystemTime::now(),
                level,
                message,
                step: step.map(str::to_string),
            });
            build.updated_at = SystemTime::now();
        }
    };
    log(
        "info",
        None,
        format!("Building template {template_id}, build {build_id}"),
    );
    let outcome = steps(&fake, &start, &log).await;
    let mut table = fake.templates.lock().expect("template table");
    let Some(build) = table.build_mut(&template_id, &build_id) else {
        return;
    };
    let now = SystemTime::now();
    build.updated_at = now;
    match outcome {
        Ok(image) => {
            build.log.push(LogEntry {
                at: now,
                level: "info",
                message: "Build finished, template is ready".into(),
                step: Some("finalize".into()),
            });
            build.image = Some(image);
            build.status = Status::Ready;
        }
        Err(failure) => {
            build.log.push(LogEntry {
                at: now,
                level: "error",
                message: format!("Build failed: {}", failure.message),
                step: Some(failure.step.clone()),
            });
            build.reason = Some((failure.message, Some(failure.step)));
            build.status = Status::Error;
        }
    }
}

/// The base, then every step; returns the new image.
async fn steps(
    fake: &Arc<E2b>,
    start: &BuildStart,
    log: &(dyn Fn(&'static str, Option<&str>, String) + Send + Sync),
) -> Result<PathBuf, Failure> {
    let base = match (&start.from_image, &start.from_template) {
        (Some(image), _) => {
            log("info", Some("base"), format!("FROM {image}"));
            fake.images
                .pull(image)
                .await
                .map_err(|e| fail("base", format!("failed to pull image {image}: {e:#}")))?
        }
        (None, Some(template)) => {
            log("info", Some("base"), format!("FROM template {template}"));
            let found = fake
                .templates
                .lock()
                .expect("template table")
                .lookup(template, false);
            match found {
                Lookup::Ready(_, image) => image,
                Lookup::NotReady(message) => return Err(fail("base", message)),
                Lookup::Unknown => {
                    return Err(fail("base", format!("template '{template}' not found")))
                }
            }
        }
        (None, None) => return Err(fail("base", "fromImage or fromTemplate is required")),
    };
    let scratch = std::fs::create_dir_all(&fake.files_dir)
        .and_then(|()| {
            tempfile::Builder::new()
                .prefix(".build-")
                .tempdir_in(&fake.files_dir)
        })
        .map_err(|e| fail("base", format!("cannot make a build directory: {e}")))?;
    let mut files: Vec<AddFile> = Vec::new();
    let mut edit = ConfigEdit {
        clear_env: true,
        ..ConfigEdit::default()
    };
    let mut env = base_env(fake, &base).await;
    let total = start.steps.len();
    for (i, step) in start.steps.iter().enumerate() {
        let n = (i + 1).to_string();
        let kind = step.kind.to_ascii_uppercase();
        log(
            "info",
            Some(&n),
            format!("[{n}/{total}] {kind} {}", step.args.join(" ")),
        );
        let workdir = edit
            .workdir
            .clone()
            .unwrap_or_else(|| DEFAULT_WORKDIR.into());
        match kind.as_str() {
            "COPY" => {
                let hash = step.files_hash.clone().unwrap_or_default();
                let tar = fake.templates.lock().expect("template table").files(&hash);
                let Some(tar) = tar else {
                    return Err(fail(&n, format!("failed to open files object from storage: no files were uploaded under hash {hash}")));
                };
                let unpacked = scratch.path().join(&n);
                let (args, into) = (step.args.clone(), workdir);
                let added =
                    tokio::task::spawn_blocking(move || copy(&tar, &unpacked, &args, &into))
                        .await
                        .map_err(|e| fail(&n, e.to_string()))?
                        .map_err(|e| fail(&n, e))?;
                files.extend(added);
            }
            "ENV" => {
                for pair in step.args.chunks(2) {
                    env.retain(|(k, _)| *k != pair[0]);
                    env.push((pair[0].clone(), pair[1].clone()));
                }
            }
            "WORKDIR" => edit.workdir = Some(resolve(&workdir, &step.args[0])),
            "USER" => edit.user = Some(step.args[0].clone()),
            other => return Err(fail(&n, format!("unsupported step type {other}"))),
        }
    }
    log(
        "info",
        Some("finalize"),
        "Creating the template's image".into(),
    );
    let images = fake.images.clone();
    let image = tokio::task::spawn_blocking(move || images.derive(&base, &files, &edit))
        .await
        .map_err(|e| fail("finalize", e.to_string()))?
        .map_err(|e| fail("finalize", format!("{e:#}")))?;
    drop(scratch);
    if let Some(cmd) = &start.start_cmd {
        // A start command would run now and be snapshotted with the template; the fake has
        // no snapshots of running processes.
        log(
            "warn",
            Some("finalize"),
            format!("start command not run (the fake cannot snapshot processes): {cmd}"),
        );
    }
    if let Some(cmd) = &start.ready_cmd {
        log(
            "info",
            Some("finalize"),
            format!("Running ready command: {cmd}"),
        );
        let output = |line: String| log("info", Some("finalize"), line);
        let ready_env = env.iter().cloned().collect();
        super::ready::check(fake, &image, cmd, ready_env, &output)
            .await
            .map_err(|e| fail("finalize", e))?;
    }
    fake.templates
        .lock()
        .expect("template table")
        .env
        .insert(image.clone(), env);
    Ok(image)
}

/// The variables a build starts with: a template's metadata ones, else the base image's.
async fn base_env(fake: &E2b, base: &Path) -> Vec<(String, String)> {
    if let Some(env) = fake.templates.lock().expect("template table").env.get(base) {
        return env.clone();
    }
    let layout = base.to_path_buf();
    tokio::task::spawn_blocking(move || crate::images::Images::env_of(&layout))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default()
}

/// COPY `args` (`src dest [owner [mode]]`) out of the (gzipped) tar at `tar`, unpacked into
/// `dir`: a file lands at `dest` (inside it when `dest` ends with `/`), a directory's
/// contents under `dest`. Relative destinations are under `workdir`. The owner is not kept:
/// the fake's images hold root-owned files.
fn copy(tar: &Path, dir: &Path, args: &[String], workdir: &str) -> Result<Vec<AddFile>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot unpack the files: {e}"))?;
    let mut file = std::fs::File::open(tar)
        .map_err(|e| format!("failed to open files object from storage: {e}"))?;
    // The SDK gzips the tar unless told not to.
    let mut magic = [0u8; 2];
    let gzipped = std::io::Read::read_exact(&mut file, &mut magic).is_ok() && magic == GZIP_MAGIC;
    std::io::Seek::rewind(&mut file).map_err(|e| format!("cannot read the files: {e}"))?;
    let reader = layer_reader(file, if gzipped { GZIP_TAR } else { PLAIN_TAR })?;
    let mut applier = Applier::new(dir, tar);
    applier
        .apply(reader, "of uploaded files")
        .map_err(|e| format!("failed to extract files: {e}"))?;
    applier
        .finish()
        .map_err(|e| format!("failed to extract files: {e}"))?;
    let (src, dest) = (args[0].trim_end_matches('/'), args[1].as_str());
    let mode = match args.get(3).filter(|m| !m.is_empty()) {
        Some(m) => Some(
            u32::from_str_radix(m, 8)
                .map_err(|_| format!("invalid permissions {m:?}: write octal, e.g. 0755"))?,
        ),
        None => None,
    };
    let source = dir.join(src.trim_start_matches('/'));
    let meta = std::fs::symlink_metadata(&source)
        .map_err(|_| format!("no files found for COPY source {src}"))?;
    let dest = resolve(workdir, dest);
    let mut out = Vec::new();
    if meta.is_dir() {
        walk(&source, dest.trim_end_matches('/'), mode, &mut out)?;
    } else {
        let target = if args[1].ends_with('/') {
            let name = source
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            format!("{}/{name}", dest.trim_end_matches('/'))
        } else {
            dest
        };
        out.push(add(&source, target, mode, &meta));
    }
    Ok(out)
}

/// The regular files under `dir`, to go under `dest`.
fn walk(dir: &Path, dest: &str, mode: Option<u32>, out: &mut Vec<AddFile>) -> Result<(), String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        let meta = entry.metadata().map_err(|e| e.to_string())?;
        let target = format!("{dest}/{}", entry.file_name().to_string_lossy());
        if meta.is_dir() {
            walk(&entry.path(), &target, mode, out)?;
        } else if meta.is_file() {
            out.push(add(&entry.path(), target, mode, &meta));
        }
    }
    Ok(())
}

fn add(source: &Path, path: String, mode: Option<u32>, meta: &std::fs::Metadata) -> AddFile {
    use std::os::unix::fs::PermissionsExt;
    AddFile {
        path,
        source: source.to_path_buf(),
        mode: mode.unwrap_or(meta.permissions().mode() & 0o7777),
    }
}

/// `path` made absolute against `workdir`.
fn resolve(workdir: &str, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!(
            "{}/{}",
            workdir.trim_end_matches('/'),
            path.trim_start_matches("./")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(json: serde_json::Value) -> BuildStart {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn malformed_builds_are_refused_before_they_start() {
        let copy = serde_json::json!({"type": "COPY", "args": ["a", "/a"], "filesHash": "ab"});
        assert!(
            start(serde_json::json!({"fromImage": "x", "steps": [copy]}))
                .check()
                .is_ok()
        );
        for (body, says) in [
            (
                serde_json::json!({"steps": []}),
                "fromImage or fromTemplate",
            ),
            (
                serde_json::json!({"fromImage": "x", "fromTemplate": "y"}),
                "cannot specify both",
            ),
            (
                serde_json::json!({"fromImage": "x", "steps": [{"type": "COPY", "args": ["a", "/a"]}]}),
                "files hash",
            ),
            (
                serde_json::json!({"fromImage": "x", "steps": [{"type": "ENV", "args": ["A"]}]}),
                "pairs",
            ),
            (
                serde_json::json!({"fromImage": "x", "steps": [{"type": "RUN", "args": ["true"]}]}),
                "refuses RUN",
            ),
        ] {
            let err = start(body.clone()).check().unwrap_err();
            assert!(err.contains(says), "{body}: {err}");
        }
    }

    #[test]
    fn destinations_resolve_against_the_workdir() {
        assert_eq!(resolve("/home/user", "app/x"), "/home/user/app/x");
        assert_eq!(resolve("/work/", "./x"), "/work/x");
        assert_eq!(resolve("/work", "/abs"), "/abs");
    }
}
