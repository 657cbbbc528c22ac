//! Modal's names for published images, `[environment/]name[:tag]`, read as the SDK's
//! `Image.from_name` and `Image.publish` read them: the tag is everything after the first
//! `:` (`latest` when there is none), the environment is what comes before the last `/`
//! (else the configured environment), and names and tags follow Modal's object-name rules.
//!
//! `tether image build --target modal --name NAME` publishes under such a name, and `tether
//! create --provider modal --image NAME` looks it up before treating `--image` as a registry
//! tag. Registry tags rarely parse as names (a registry host holds a `.` or a `:` before the
//! `/`), and one that does (`alpine:3.21`) is looked up first and then pulled when Modal has
//! no image by that name.

use std::fmt;

/// The longest object name (and tag, and environment name) Modal accepts.
const MAX_NAME_LEN: usize = 64;
/// The tag a name without one stands for.
const DEFAULT_TAG: &str = "latest";
/// The prefix of Modal's image ids, which names may not take.
const IMAGE_ID_PREFIX: &str = "im-";

/// A Modal image name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ImageName {
    environment: Option<String>,
    name: String,
    tag: String,
}

/// Why a string is not a Modal image name.
#[derive(Debug, thiserror::Error)]
#[error(
    "{given:?} is not a Modal image name: {reason}; a name is [ENVIRONMENT/]NAME[:TAG], with \
     NAME and TAG of at most 64 letters, digits, '-', '_' or '.'"
)]
pub(crate) struct NameError {
    given: String,
    reason: &'static str,
}

impl ImageName {
    /// Parses `[environment/]name[:tag]`.
    pub(crate) fn parse(given: &str) -> Result<ImageName, NameError> {
        let fail = |reason| NameError {
            given: given.to_string(),
            reason,
        };
        let (path, tag) = match given.split_once(':') {
            Some((path, tag)) => (path, tag),
            None => (given, DEFAULT_TAG),
        };
        let (environment, name) = match path.rsplit_once('/') {
            Some((environment, name)) => (Some(environment), name),
            None => (None, path),
        };
        if let Some(environment) = environment {
            if !is_environment_name(environment) {
                return Err(fail("the part before '/' is not an environment name"));
            }
        }
        if !is_object_name(name) {
            return Err(fail("the name is empty, too long or has other characters"));
        }
        if name.starts_with(IMAGE_ID_PREFIX) {
            return Err(fail(
                "names may not start with 'im-', which marks image ids",
            ));
        }
        if !is_object_name(tag) {
            return Err(fail("the tag is empty, too long or has other characters"));
        }
        Ok(ImageName {
            environment: environment.map(str::to_string),
            name: name.to_string(),
            tag: tag.to_string(),
        })
    }

    /// The `tag` field of `ImageGetByTag` and `ImagePublish`: `environment/name:tag`, with the
    /// name's own environment, else `fallback` (none when that is empty: Modal's default).
    pub(crate) fn wire(&self, fallback: &str) -> String {
        match self.environment.as_deref().unwrap_or(fallback) {
            "" => format!("{}:{}", self.name, self.tag),
            environment => format!("{environment}/{}:{}", self.name, self.tag),
        }
    }
}

impl fmt::Display for ImageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(environment) = &self.environment {
            write!(f, "{environment}/")?;
        }
        write!(f, "{}:{}", self.name, self.tag)
    }
}

fn is_object_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Environment names start with a letter or digit; older ones may hold periods.
fn is_environment_name(s: &str) -> bool {
    s.len() <= MAX_NAME_LEN
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_default_to_latest_and_take_an_environment() {
        let plain = ImageName::parse("sandbox").unwrap();
        assert_eq!(plain.to_string(), "sandbox:latest");
        assert_eq!(plain.wire(""), "sandbox:latest");
        assert_eq!(plain.wire("dev"), "dev/sandbox:latest");
        let full = ImageName::parse("prod/sandbox:v1").unwrap();
        assert_eq!(full.wire("dev"), "prod/sandbox:v1");
    }

    #[test]
    fn registry_tags_and_ids_are_not_names() {
        for tag in [
            "ghcr.io/me/agent:1",
            "127.0.0.1:5000/base:v1",
            "docker.io/library/alpine",
            "im-abc",
            "",
            "a b",
            "x:",
        ] {
            assert!(ImageName::parse(tag).is_err(), "{tag}");
        }
        // A Docker Hub short name is a valid Modal name too: looked up, then pulled.
        assert!(ImageName::parse("alpine:3.21").is_ok());
        let err = ImageName::parse("im-abc").unwrap_err();
        assert!(err.to_string().contains("im-"), "{err}");
    }
}
