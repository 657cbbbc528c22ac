//! What building an image on a provider's own builder (`tether image build --target
//! e2b|daytona|modal|docker|runloop`) takes and reports; [`crate::build_image`] hands it to
//! the provider's module, which submits the build through that provider's API,
//! streams its log, waits until it is ready, and returns the name that `tether create
//! --provider X --image NAME` takes.
//!
//! - [`e2b::template`](super::e2b::template): a template build (`POST /v3/templates`, the agent uploaded as a COPY step's
//!   file, status polled with its log entries).
//! - [`daytona::snapshot`](super::daytona::snapshot): a snapshot (`POST /snapshots` from a registry image, polled until `active`,
//!   with its build log).
//! - [`modal::build`](super::modal::build): an image (`ImageGetOrCreate` with the agent as a context file, its log
//!   streamed by `ImageJoinStreaming`).
//! - [`docker::build`](super::docker::build): the OCI image built here and loaded into the
//!   relay's Docker or Podman engine.
//! - [`runloop::blueprint`](super::runloop::blueprint): a blueprint (`POST /v1/blueprints`
//!   from a Dockerfile, the agent uploaded as its build context, polled with its log).
//!
//! Provider credentials and endpoints come from the same settings the relay's providers read
//! (environment, else `<data_dir>/config.toml`), so a build needs no running relay.

use std::path::PathBuf;

use serde::Serialize;

use tether_oci::config::Overrides;
use tether_oci::error::ImageError;
use tether_oci::reference::Reference;
use tether_oci::registry::Registry;

/// The providers an image can be built on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builder {
    /// An E2B template.
    E2b,
    /// A Daytona snapshot.
    Daytona,
    /// A Modal image.
    Modal,
    /// An image loaded into the relay's Docker or Podman engine.
    Docker,
    /// A Runloop blueprint.
    Runloop,
}

impl Builder {
    /// The provider's name, as `tether create --provider` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Builder::E2b => "e2b",
            Builder::Daytona => "daytona",
            Builder::Modal => "modal",
            Builder::Docker => "docker",
            Builder::Runloop => "runloop",
        }
    }
}

/// What to build on a provider.
#[derive(Debug, Clone)]
pub struct RemoteBuild {
    /// The name to build under: the E2B template name, the Daytona snapshot name, the Modal
    /// image's name.
    pub name: String,
    /// A registry image the provider pulls as the base (`--from`), when given.
    pub from: Option<String>,
    /// A base on disk (`--base`: OCI layout or tarball, root file system directory) for
    /// targets that build the image here and push it first.
    pub base: Option<PathBuf>,
    /// Where to push an image built here before the provider pulls it (`--push`).
    pub push: Option<Reference>,
    /// Speak plain HTTP to the registry of `push`.
    pub insecure: bool,
    /// The static agent to bake in.
    pub agent: PathBuf,
    /// Environment, working directory, user and start mode of the image.
    pub overrides: Overrides,
    /// The timestamp recorded in locally built layers (SOURCE_DATE_EPOCH), seconds.
    pub epoch: u64,
}

/// Progress of a remote build, as it happens.
#[derive(Debug, Clone)]
pub enum Event {
    /// A step of Tether's own (uploading the agent, submitting, waiting).
    Step(String),
    /// A line of the provider's build log.
    Log(String),
}

/// A finished remote build.
#[derive(Debug, Clone, Serialize)]
pub struct RemoteBuilt {
    /// `e2b`, `daytona` or `modal`.
    pub provider: &'static str,
    /// What `tether create --provider X --image NAME` takes.
    pub name: String,
    /// The provider's id of what was built (template id, snapshot id, image id).
    pub id: String,
    /// The provider's id of this build, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
}

/// Why a remote build failed.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The build request is incomplete or contradictory for this provider.
    #[error("{0}")]
    Usage(String),
    /// A setting (API key, URL) is missing or invalid.
    #[error("{0}")]
    Settings(String),
    /// The provider's API refused or failed a request.
    #[error("{provider}: {message}")]
    Api {
        /// `e2b`, `daytona` or `modal`.
        provider: &'static str,
        /// What was asked and what the provider answered.
        message: String,
    },
    /// The provider ran the build and it failed.
    #[error("the {provider} build of {name} failed: {reason}")]
    BuildFailed {
        /// `e2b`, `daytona` or `modal`.
        provider: &'static str,
        /// The name being built.
        name: String,
        /// The provider's reason.
        reason: String,
    },
    /// The build did not finish in time.
    #[error("the {provider} build of {name} did not finish within {waited:?}; it may still be running on {provider}")]
    Timeout {
        /// `e2b`, `daytona` or `modal`.
        provider: &'static str,
        /// The name being built.
        name: String,
        /// How long Tether waited.
        waited: std::time::Duration,
    },
    /// Building, reading or pushing an image here failed.
    #[error(transparent)]
    Image(#[from] ImageError),
}

/// Fails when `from`'s registry says it has no such image, so that a typo costs no upload and
/// no build. Other failures to look (no credentials here, a registry only the provider can
/// reach) become a note, and `provider` judges the base itself.
#[cfg_attr(
    not(any(feature = "e2b", feature = "modal", feature = "runloop")),
    expect(
        dead_code,
        reason = "the E2B, Modal and Runloop builds check their base; Daytona's registry does"
    )
)]
pub(crate) async fn check_base(
    provider: &str,
    from: &str,
    insecure: bool,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<(), TargetError> {
    let reference = Reference::parse(from)?;
    let registry = Registry::new(&reference, insecure || reference.is_loopback())?;
    match registry.get_manifest(reference.target_str()).await {
        Ok(_) => Ok(()),
        Err(ImageError::Registry {
            status: 404,
            message,
            ..
        }) => Err(TargetError::Usage(format!(
            "the base {from} does not exist: its registry answered HTTP 404{message}; check \
             --from (push a base with `tether image push LAYOUT REGISTRY/NAME:TAG`)"
        ))),
        Err(e) => {
            events(Event::Log(format!(
                "note: cannot check {from} from here ({e}); {provider} will try to pull it"
            )));
            Ok(())
        }
    }
}
