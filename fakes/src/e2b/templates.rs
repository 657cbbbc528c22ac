//! The fake E2B's templates and their builds: what `POST /v3/templates` creates, what a
//! build records (status, log, reason, and the image once ready), the files uploaded for
//! COPY steps, and how a sandbox create or a `fromTemplate` finds a template: by its id or
//! its name (`name[:tag]`, the tag `default` when none), running its last ready build's
//! image. The routes are in [`super::template_api`] and [`super::storage`], the builds run
//! in [`super::builder`].

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::SystemTime;

use crate::sandboxes::random_id;

/// Template ids: 20 characters of `[a-z0-9]`, as E2B makes them.
const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
const ID_LEN: usize = 20;
/// The tag of a build named without one.
pub(super) const DEFAULT_TAG: &str = "default";

/// `TemplateBuildStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Status {
    Waiting,
    Building,
    Ready,
    Error,
}

impl Status {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Status::Waiting => "waiting",
            Status::Building => "building",
            Status::Ready => "ready",
            Status::Error => "error",
        }
    }
}

/// One `BuildLogEntry`.
#[derive(Clone, Debug)]
pub(super) struct LogEntry {
    pub at: SystemTime,
    pub level: &'static str,
    pub message: String,
    pub step: Option<String>,
}

/// One build of a template.
#[derive(Debug)]
pub(super) struct Build {
    pub id: String,
    pub tags: Vec<String>,
    pub status: Status,
    pub log: Vec<LogEntry>,
    /// `BuildStatusReason`: message and failed step.
    pub reason: Option<(String, Option<String>)>,
    /// The image, once ready.
    pub image: Option<PathBuf>,
    pub updated_at: SystemTime,
}

/// One template.
#[derive(Debug)]
pub(super) struct Template {
    pub id: String,
    pub name: String,
    pub cpu_count: u32,
    pub memory_mb: u32,
    pub created_at: SystemTime,
    pub builds: Vec<Build>,
    pub spawn_count: u64,
}

/// Every template, and the uploaded files of COPY steps.
#[derive(Debug, Default)]
pub(super) struct Table {
    pub(super) templates: BTreeMap<String, Template>,
    /// A built template image → its metadata's variables (the base's and the ENV steps'):
    /// what build steps and the ready command run with, and a `fromTemplate` build starts
    /// from. Never in a sandbox's processes, as with E2B.
    pub(super) env: HashMap<PathBuf, Vec<(String, String)>>,
    /// Files hash → the uploaded tar.
    pub(super) files: HashMap<String, PathBuf>,
    /// Files hash → the token its upload URL carries.
    pub(super) uploads: HashMap<String, String>,
}

/// What a sandbox create finds under a template name.
pub(super) enum Lookup {
    /// A template with a ready build: its id and image.
    Ready(String, PathBuf),
    /// A template that has no ready build (under that tag).
    NotReady(String),
    /// No such template: the fake runs it on its host-like default root file system.
    Unknown,
}

impl Table {
    pub(super) fn find(&self, id_or_name: &str) -> Option<&Template> {
        self.templates
            .get(id_or_name)
            .or_else(|| self.templates.values().find(|t| t.name == id_or_name))
    }

    pub(super) fn build_mut(&mut self, id: &str, build: &str) -> Option<&mut Build> {
        self.templates
            .get_mut(id)?
            .builds
            .iter_mut()
            .find(|b| b.id == build)
    }

    /// The tar uploaded under `hash`.
    pub(super) fn files(&self, hash: &str) -> Option<PathBuf> {
        self.files.get(hash).cloned()
    }

    /// The image of `reference` (`id`, `name` or `name:tag`), for a sandbox or a
    /// `fromTemplate`; counts a spawn when `spawn`.
    pub(super) fn lookup(&mut self, reference: &str, spawn: bool) -> Lookup {
        let (name, tag) = reference
            .split_once(':')
            .unwrap_or((reference, DEFAULT_TAG));
        let Some(id) = self.find(name).map(|t| t.id.clone()) else {
            return Lookup::Unknown;
        };
        let template = self.templates.get_mut(&id).expect("found above");
        let ready = template
            .builds
            .iter()
            .rev()
            .find(|b| b.status == Status::Ready && b.tags.iter().any(|t| t == tag));
        match ready.and_then(|b| b.image.clone()) {
            Some(image) => {
                if spawn {
                    template.spawn_count += 1;
                }
                Lookup::Ready(id, image)
            }
            None => Lookup::NotReady(format!(
                "template '{reference}' has no successful build yet; wait for its build to be \
                 ready"
            )),
        }
    }
}

/// A new template id.
pub(super) fn new_id() -> String {
    random_id(ID_LEN, ID_ALPHABET)
}

/// E2B's `id.ParseName`: `[namespace/]alias[:tag]`, lower-cased; the alias (with its
/// namespace) and the tags, if any.
pub(super) fn parse_name(raw: &str) -> Result<(String, Vec<String>), String> {
    let raw = raw.trim();
    let (identifier, tag) = match raw.split_once(':') {
        Some((id, tag)) => (id, Some(tag)),
        None => (raw, None),
    };
    let alias = match identifier.split_once('/') {
        Some((ns, alias)) => format!(
            "{}/{}",
            clean(ns, "namespace", b"")?,
            clean(alias, "template ID", b"")?
        ),
        None => clean(identifier, "template ID", b"")?,
    };
    let tags = match tag {
        Some(tag) => vec![clean(tag, "tag", b".")?],
        None => Vec::new(),
    };
    Ok((alias, tags))
}

pub(super) fn clean(value: &str, what: &str, extra: &[u8]) -> Result<String, String> {
    let cleaned = value.trim().to_ascii_lowercase();
    let valid = !cleaned.is_empty()
        && cleaned.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_".contains(&b) || extra.contains(&b)
        });
    if valid {
        Ok(cleaned)
    } else {
        Err(format!("invalid {what}: {value}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_as_e2bs() {
        assert_eq!(
            parse_name("My-Template:V1").unwrap(),
            ("my-template".to_string(), vec!["v1".to_string()])
        );
        assert_eq!(
            parse_name("team/t").unwrap(),
            ("team/t".to_string(), vec![])
        );
        assert!(parse_name("a b").is_err());
        assert!(parse_name("x:").is_err());
    }
}
