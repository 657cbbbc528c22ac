//! Image references in registries: `REGISTRY/NAME:TAG` (or `@sha256:…`), with Docker's
//! conventions for short names (`ubuntu` is `docker.io/library/ubuntu:latest`).

use std::fmt;

use super::constants::DEFAULT_TAG;
use super::digest::Digest;
use super::error::ImageError;

/// Docker Hub's name in references, and the host that serves its API.
const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// The longest tag the distribution spec allows.
const MAX_TAG_LEN: usize = 128;

/// A parsed reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]`, e.g. `localhost:5000` or `ghcr.io`.
    pub registry: String,
    /// The repository, e.g. `acme/sandbox`.
    pub repository: String,
    /// The tag or digest to put the manifest under.
    pub target: Target,
}

/// What a manifest is stored under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A tag.
    Tag(String),
    /// A digest (push by digest: no tag moves).
    Digest(Digest),
}

impl Reference {
    /// Parses `[REGISTRY/]NAME[:TAG|@DIGEST]`.
    pub fn parse(s: &str) -> Result<Reference, ImageError> {
        let bad = |reason: &str| ImageError::BadReference {
            reference: s.to_string(),
            reason: reason.into(),
        };
        let (rest, digest) = match s.split_once('@') {
            Some((rest, d)) => (rest, Some(Digest::parse(d).map_err(|e| bad(&e))?)),
            None => (s, None),
        };
        let (name, tag) = match rest.rsplit_once(':') {
            Some((name, tag)) if !tag.contains('/') => (name, Some(tag)),
            _ => (rest, None),
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, path)) if first.contains(['.', ':']) || first == "localhost" => {
                (first.to_string(), path.to_string())
            }
            _ if !name.contains('/') => (DOCKER_HUB.to_string(), format!("library/{name}")),
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        check_repository(&repository).map_err(|r| bad(&r))?;
        let target = match (tag, digest) {
            (_, Some(d)) => Target::Digest(d),
            (Some(t), None) => {
                check_tag(t).map_err(|r| bad(&r))?;
                Target::Tag(t.to_string())
            }
            (None, None) => Target::Tag(DEFAULT_TAG.into()),
        };
        Ok(Reference {
            registry,
            repository,
            target,
        })
    }

    /// The host to send API requests to.
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// Whether the registry is on this machine (spoken to over plain HTTP).
    pub fn is_loopback(&self) -> bool {
        let host = match self.registry.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => &self.registry,
        };
        host == "localhost" || host.starts_with("127.") || host == "[::1]"
    }

    /// The tag or digest, as it goes in a manifest URL.
    pub fn target_str(&self) -> &str {
        match &self.target {
            Target::Tag(t) => t,
            Target::Digest(d) => d.as_str(),
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            Target::Tag(t) => write!(f, "{}/{}:{t}", self.registry, self.repository),
            Target::Digest(d) => write!(f, "{}/{}@{d}", self.registry, self.repository),
        }
    }
}

/// Repository names: lowercase path components of letters, digits and single separators.
fn check_repository(repo: &str) -> Result<(), String> {
    if repo.is_empty() {
        return Err("the name is empty".into());
    }
    for part in repo.split('/') {
        let ok = !part.is_empty()
            && part
                .bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'))
            && part.as_bytes()[0].is_ascii_alphanumeric()
            && part.as_bytes()[part.len() - 1].is_ascii_alphanumeric();
        if !ok {
            return Err(format!(
                "name component {part:?} must be lowercase letters and digits, separated by single '.', '_' or '-'"
            ));
        }
    }
    Ok(())
}

/// Tags: up to 128 letters, digits, `_`, `.` and `-`, not starting with `.` or `-`.
fn check_tag(tag: &str) -> Result<(), String> {
    let ok = !tag.is_empty()
        && tag.len() <= MAX_TAG_LEN
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && !tag.starts_with(['.', '-']);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tag {tag:?} must be up to 128 letters, digits, '_', '.' or '-'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_follow_dockers_conventions() {
        let r = Reference::parse("localhost:5000/tether/sandbox:v1").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.target_str()),
            ("localhost:5000", "tether/sandbox", "v1")
        );
        assert!(r.is_loopback());
        assert_eq!(r.to_string(), "localhost:5000/tether/sandbox:v1");

        let r = Reference::parse("ubuntu").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.target_str()),
            ("docker.io", "library/ubuntu", "latest")
        );
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert!(!r.is_loopback());

        let r = Reference::parse("ghcr.io/acme/box").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("ghcr.io", "acme/box")
        );
        assert!(Reference::parse("127.0.0.1:5000/x:y")
            .unwrap()
            .is_loopback());

        let d = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let r = Reference::parse(&format!("localhost/x@{d}")).unwrap();
        assert_eq!(r.target, Target::Digest(Digest::parse(d).unwrap()));

        for bad in [
            "",
            "localhost:5000/",
            "Upper/case",
            "a//b",
            "x:-tag",
            "x@sha256:12",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }
}
