//! The one place that names every provider: the local runtime always, and each provider of
//! `tether-providers` this build has a feature for.

use std::collections::BTreeMap;
use std::sync::Arc;

use tether_relay_core::provider::{Provider, ProviderContext};

/// Builds every provider that can be configured on this host, keyed by name.
pub(crate) fn build(ctx: &ProviderContext) -> BTreeMap<&'static str, Arc<dyn Provider>> {
    #[cfg_attr(
        not(any(
            feature = "e2b",
            feature = "daytona",
            feature = "modal",
            feature = "runloop",
            feature = "docker"
        )),
        expect(unused_mut, reason = "only the cloud and docker providers are added")
    )]
    let mut providers: Vec<Arc<dyn Provider>> =
        vec![Arc::new(tether_local::LocalProvider::new(ctx.clone()))];
    #[cfg(any(
        feature = "e2b",
        feature = "daytona",
        feature = "modal",
        feature = "runloop"
    ))]
    {
        let settings = tether_providers::Settings::load(&ctx.data_dir);
        #[cfg(feature = "e2b")]
        providers.push(Arc::new(tether_providers::e2b::E2bProvider::new(&settings)));
        #[cfg(feature = "daytona")]
        providers.push(Arc::new(tether_providers::daytona::DaytonaProvider::new(
            &settings,
        )));
        #[cfg(feature = "modal")]
        providers.push(Arc::new(tether_providers::modal::ModalProvider::new(
            &settings,
        )));
        #[cfg(feature = "runloop")]
        providers.push(Arc::new(tether_providers::runloop::RunloopProvider::new(
            &settings,
        )));
    }
    #[cfg(feature = "docker")]
    providers.push(Arc::new(tether_providers::docker::DockerProvider::new(ctx)));
    providers
        .into_iter()
        .map(|provider| (provider.name(), provider))
        .collect()
}
