//! The relay decides what a tenant may use: which providers, the host's network, host
//! directories as images, an unconfined seccomp filter, and how much memory, CPU, processes,
//! disk, lifetime and sandboxes. A create request is checked here, in this order, before any
//! provider sees it:
//!
//! 1. every number in its valid range (`ranges`, 400 naming the range), and an allowlist's
//!    presets expanded into their hosts (400 for an unknown one), so what follows checks
//!    host names only;
//! 2. what is for admins only, and the tenant's providers (403 naming what to do), with the
//!    networks and hosts of an allowlist within what the tenant may allow (`egress_networks`,
//!    `egress_hosts`);
//! 3. a host directory image resolved and checked against the image roots, an `oci:` one
//!    kept out of the data directory (`images`);
//! 4. default sizes filled in where the request names none (`config`; the default TTL is
//!    applied to the sandbox's record, not the spec);
//! 5. every value within the tenant's maximum (403 naming the limit);
//!
//! and, when a sandbox is about to be made, the tenant's sandbox count ([`Policy::reserve`]).

mod config;
mod images;
mod ranges;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) use config::ConfigError;
pub(crate) use config::{Limits, PolicyFile};

use super::error::ApiError;
use crate::caller::Caller;
use images::{ImageRoots, Refusal};
use ipnet::IpNet;
use tether_egress::reach;
use tether_oci::unpack::is_oci_ref;
use tether_relay_core::egress::policy::Allowlist;
use tether_relay_core::egress::preset;
use tether_relay_core::provider::{NetworkPolicy, Provider, SandboxSpec};
use tether_store::{Store, Tenant};

pub(super) use ranges::lifetime as check_lifetime;

/// What `tether serve` was told about policy: the file's contents and the image roots.
#[derive(Clone, Debug, Default)]
pub struct PolicyConfig {
    /// The parsed policy file (the built-in defaults when there is none).
    pub file: PolicyFile,
    /// Directories under which admin tokens may use host directories as images.
    pub image_roots: Vec<PathBuf>,
}

impl PolicyConfig {
    /// Reads the policy file at `path`, if one is given.
    pub fn load(
        path: Option<&Path>,
        image_roots: Vec<PathBuf>,
    ) -> Result<PolicyConfig, ConfigError> {
        let file = match path {
            Some(path) => PolicyFile::load(path)?,
            None => PolicyFile::default(),
        };
        Ok(PolicyConfig { file, image_roots })
    }
}

/// A running relay's policy.
pub(super) struct Policy {
    file: PolicyFile,
    images: ImageRoots,
    /// Creates under way per tenant, counted with the store's sandboxes against
    /// `max_sandboxes`.
    pending: Arc<Mutex<HashMap<Tenant, u64>>>,
    /// Makes a tenant's count-and-reserve one step, so concurrent creates cannot all pass.
    turn: tokio::sync::Mutex<()>,
}

/// A place in a tenant's sandbox count, held while its sandbox is made; released on drop
/// (by then the store counts the sandbox, or it was never made).
pub(super) struct Reservation {
    pending: Arc<Mutex<HashMap<Tenant, u64>>>,
    tenant: Tenant,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = pending.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                pending.remove(&self.tenant);
            }
        }
    }
}

impl Policy {
    /// The policy of a relay with data directory `data_dir` (which exists) and `providers`.
    pub(super) fn new<'a>(
        config: &PolicyConfig,
        data_dir: &Path,
        mut providers: impl Iterator<Item = &'a str> + Clone,
    ) -> anyhow::Result<Policy> {
        for name in config.file.provider_names() {
            anyhow::ensure!(
                providers.clone().any(|p| p == name),
                "the policy file allows provider `{name}`, which this relay does not have (it \
                 has: {}); fix the name",
                providers.by_ref().collect::<Vec<_>>().join(", ")
            );
        }
        Ok(Policy {
            file: config.file.clone(),
            images: ImageRoots::new(&config.image_roots, data_dir)?,
            pending: Default::default(),
            turn: Default::default(),
        })
    }

    /// What `tenant` may use.
    pub(super) fn limits(&self, tenant: &Tenant) -> Limits {
        self.file.resolve(Some(tenant.as_str()))
    }

    /// Checks a create request for `provider` from `caller`, and completes it: defaults filled
    /// in, a host directory image replaced by its resolved path.
    pub(super) fn admit(
        &self,
        caller: &Caller,
        provider: &dyn Provider,
        spec: &mut SandboxSpec,
    ) -> Result<(), ApiError> {
        ranges::check_spec(spec).map_err(ApiError::Invalid)?;
        // Before any check of the allowlist: a preset is its hosts, bounded like any other.
        spec.egress.allow_hosts =
            preset::expand(&spec.egress.allow_hosts).map_err(ApiError::Invalid)?;
        let tenant = &caller.tenant;
        let limits = self.limits(tenant);
        let admin = caller.role.is_admin();
        if let Some(allowed) = &limits.providers {
            if !allowed.contains(provider.name()) {
                let list: Vec<&str> = allowed.iter().map(String::as_str).collect();
                return Err(ApiError::Forbidden(format!(
                    "tenant {tenant} may not use provider `{}`; it may use: {}. The relay's \
                     operator can allow it (`providers` in the policy file)",
                    provider.name(),
                    list.join(", ")
                )));
            }
        }
        if spec.network == NetworkPolicy::Host && !admin && !limits.network_host {
            return Err(ApiError::Forbidden(format!(
                "--network host shares the host's network and is for admin tokens; tenant \
                 {tenant}'s policy does not allow it (`network_host = true` in its table of \
                 the policy file does)"
            )));
        }
        if let Some(allowlist) = Allowlist::from_spec(spec).map_err(ApiError::Invalid)? {
            check_networks(tenant, admin, &limits, &allowlist)?;
            check_hosts(tenant, admin, &limits, &allowlist)?;
        }
        if spec.seccomp_unconfined && !admin {
            return Err(ApiError::Forbidden(
                "seccomp_unconfined lifts the system call filter and is for admin tokens only; \
                 leave it out"
                    .into(),
            ));
        }
        if provider.runs_here() {
            self.admit_image(caller, spec)?;
        }
        fill_defaults(&limits, provider, spec);
        check_maxima(tenant, &limits, spec)
    }

    /// A host directory image only for admins and only where [`ImageRoots`] allows; the spec
    /// then carries the resolved path, which is all the provider sees.
    fn admit_image(&self, caller: &Caller, spec: &mut SandboxSpec) -> Result<(), ApiError> {
        let Some(image) = spec.image.as_deref() else {
            return Ok(());
        };
        if is_oci_ref(image) {
            return self.images.check_oci(image).map_err(refusal);
        }
        if !caller.role.is_admin() {
            return Err(ApiError::Forbidden(format!(
                "image {image:?} is a directory of the relay's host, which only admin tokens \
                 may use; use an oci: image instead (`tether image build`)"
            )));
        }
        let dir = self.images.resolve(image).map_err(refusal)?;
        let dir = dir.to_str().ok_or_else(|| {
            ApiError::Invalid(format!(
                "image {image:?} resolves to a path that is not UTF-8"
            ))
        })?;
        spec.image = Some(dir.to_string());
        Ok(())
    }

    /// A renewed TTL within the tenant's maximum.
    pub(super) fn check_renew(&self, tenant: &Tenant, ttl: Duration) -> Result<(), ApiError> {
        let limits = self.limits(tenant);
        if ttl > limits.max_ttl {
            return Err(over_max(
                tenant,
                "ttl",
                &duration(ttl),
                &duration(limits.max_ttl),
            ));
        }
        Ok(())
    }

    /// Takes a place in `tenant`'s sandbox count, or refuses with 403 when it has its
    /// maximum already.
    pub(super) async fn reserve(
        &self,
        store: &Store,
        tenant: &Tenant,
    ) -> Result<Reservation, ApiError> {
        let max = self.limits(tenant).max_sandboxes;
        let _turn = self.turn.lock().await;
        let existing = store.count(tenant).await?;
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let underway = pending.get(tenant).copied().unwrap_or(0);
        if existing.saturating_add(underway) >= max {
            return Err(ApiError::Forbidden(format!(
                "tenant {tenant} has {existing} sandboxes, its maximum (`max_sandboxes` = \
                 {max}); delete some (`tether rm`) or ask the relay's operator to raise it"
            )));
        }
        *pending.entry(tenant.clone()).or_default() += 1;
        Ok(Reservation {
            pending: self.pending.clone(),
            tenant: tenant.clone(),
        })
    }
}

/// Every network of `allowlist` within what the caller may allow: for a member, public
/// address space and the tenant's `egress_networks`; for an admin, anything but what lies
/// inside never-reachable space (see [`reach`]).
fn check_networks(
    tenant: &Tenant,
    admin: bool,
    limits: &Limits,
    allowlist: &Allowlist,
) -> Result<(), ApiError> {
    let whole = |addr: std::net::IpAddr| IpNet::new(addr, 0).expect("a /0 is a network");
    let everything = [
        whole(std::net::Ipv4Addr::UNSPECIFIED.into()),
        whole(std::net::Ipv6Addr::UNSPECIFIED.into()),
    ];
    let (permitted, host) = if admin {
        (&everything[..], Vec::new())
    } else {
        (
            &limits.egress_networks[..],
            reach::shared().host_addresses(),
        )
    };
    for net in &allowlist.networks {
        let Some(restricted) = reach::restricted_part(net, permitted, &host) else {
            continue;
        };
        let why = restricted.why;
        let may = if restricted.never {
            "nothing can allow it; allow the network of the service instead".to_string()
        } else {
            let extra: Vec<String> = limits
                .egress_networks
                .iter()
                .map(|n| n.to_string())
                .collect();
            format!(
                "tenant {tenant}'s member tokens may allow public addresses{}; the relay's \
                 operator can permit more (`egress_networks` in the policy file)",
                if extra.is_empty() {
                    " only".to_string()
                } else {
                    format!(" and {}", extra.join(", "))
                }
            )
        };
        return Err(ApiError::Forbidden(format!(
            "--allow-cidr {net} is refused: {why}; {may}"
        )));
    }
    Ok(())
}

/// Every host of `allowlist` (its own, its presets' and its secrets') within the tenant's
/// `egress_hosts`, for a member; an admin may allow any host.
fn check_hosts(
    tenant: &Tenant,
    admin: bool,
    limits: &Limits,
    allowlist: &Allowlist,
) -> Result<(), ApiError> {
    let Some(bounds) = limits.egress_hosts.as_ref().filter(|_| !admin) else {
        return Ok(());
    };
    let Some(host) = allowlist
        .hosts
        .iter()
        .find(|h| !bounds.iter().any(|b| b.covers(h)))
    else {
        return Ok(());
    };
    let from: Vec<String> = preset::holding(&host.to_string())
        .map(|p| format!(" (a host of {})", p.reference()))
        .collect();
    let may: Vec<String> = bounds.iter().map(|b| b.to_string()).collect();
    Err(ApiError::Forbidden(format!(
        "--allow-host {host}{} is refused: tenant {tenant}'s member tokens may allow only {}; \
         the relay's operator can permit more (`egress_hosts` in the policy file)",
        from.concat(),
        if may.is_empty() {
            "no host".to_string()
        } else {
            format!("hosts within {}", may.join(", "))
        }
    )))
}

fn refusal(r: Refusal) -> ApiError {
    match r {
        Refusal::Invalid(m) => ApiError::Invalid(m),
        Refusal::Forbidden(m) => ApiError::Forbidden(m),
    }
}

/// Default sizes where the request names none and the provider runs sandboxes here (the
/// others size them by image and refuse sizes). The default TTL is the relay's to enforce
/// and is not put in the spec (see `sandboxes::create_new`).
fn fill_defaults(limits: &Limits, provider: &dyn Provider, spec: &mut SandboxSpec) {
    if provider.runs_here() {
        spec.memory_bytes.get_or_insert(limits.memory);
        spec.cpus.get_or_insert(limits.cpus);
        spec.pids.get_or_insert(limits.pids);
        spec.disk_bytes.get_or_insert(limits.disk);
    }
}

fn check_maxima(tenant: &Tenant, limits: &Limits, spec: &SandboxSpec) -> Result<(), ApiError> {
    if let Some(m) = spec.memory_bytes.filter(|m| *m > limits.max_memory) {
        return Err(over_max(
            tenant,
            "memory",
            &size(m),
            &size(limits.max_memory),
        ));
    }
    if let Some(c) = spec.cpus.filter(|c| *c > limits.max_cpus) {
        let show = |c: f64| format!("{c} cores");
        return Err(over_max(tenant, "cpus", &show(c), &show(limits.max_cpus)));
    }
    if let Some(p) = spec.pids.filter(|p| *p > limits.max_pids) {
        let show = |p: u64| format!("{p} processes");
        return Err(over_max(tenant, "pids", &show(p), &show(limits.max_pids)));
    }
    if let Some(d) = spec.disk_bytes.filter(|d| *d > limits.max_disk) {
        return Err(over_max(tenant, "disk", &size(d), &size(limits.max_disk)));
    }
    if let Some(t) = spec.ttl.filter(|t| *t > limits.max_ttl) {
        return Err(over_max(
            tenant,
            "ttl",
            &duration(t),
            &duration(limits.max_ttl),
        ));
    }
    Ok(())
}

fn over_max(tenant: &Tenant, what: &str, asked: &str, max: &str) -> ApiError {
    ApiError::Forbidden(format!(
        "{what} {asked} is above tenant {tenant}'s maximum of {max} (`max_{what}` in the \
         relay's policy); ask for less, or ask the relay's operator to raise it"
    ))
}

/// Bytes, with the largest binary unit that divides them.
fn size(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} bytes")
}

fn duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}
