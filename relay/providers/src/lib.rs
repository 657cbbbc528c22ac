//! The relay's providers beyond the local runtime, one Cargo feature each (all on by default):
//! `e2b`, `daytona`, `modal` and `runloop` (what they share is `cloud`: settings, the control
//! planes' HTTP, the agent's websocket through each edge) and `docker` (Docker or Podman over
//! the Engine API). Each implements [`tether_relay_core::provider::Provider`] and builds its
//! own images ([`image`]: `tether image build --target NAME`). The relay's server registers
//! them; in this crate only [`build_image`], here at its root, names them all.
#![warn(missing_docs)]

#[cfg(feature = "cloud")]
mod cloud;
#[cfg(feature = "daytona")]
pub mod daytona;
#[cfg(feature = "docker")]
pub mod docker;
#[cfg(feature = "e2b")]
pub mod e2b;
pub mod image;
#[cfg(feature = "modal")]
pub mod modal;
#[cfg(feature = "runloop")]
pub mod runloop;

#[cfg(feature = "cloud")]
pub use cloud::settings::Settings;

use image::{Builder, Event, RemoteBuild, RemoteBuilt, TargetError};

/// Builds `req` on `builder`, reporting progress to `events`.
pub async fn build_image(
    builder: Builder,
    req: &RemoteBuild,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<RemoteBuilt, TargetError> {
    #[cfg(not(any(feature = "cloud", feature = "docker")))]
    let _ = (req, events);
    match builder {
        #[cfg(feature = "e2b")]
        Builder::E2b => e2b::template::build(req, events).await,
        #[cfg(feature = "daytona")]
        Builder::Daytona => daytona::snapshot::build(req, events).await,
        #[cfg(feature = "modal")]
        Builder::Modal => modal::build::build(req, events).await,
        #[cfg(feature = "docker")]
        Builder::Docker => docker::build::build(req, events).await,
        #[cfg(feature = "runloop")]
        Builder::Runloop => runloop::blueprint::build(req, events).await,
        #[allow(
            unreachable_patterns,
            reason = "reached only when a provider's feature is off"
        )]
        other => Err(TargetError::Usage(format!(
            "this tether was built without the {0} provider: rebuild it with `--features {0}`",
            other.name()
        ))),
    }
}
