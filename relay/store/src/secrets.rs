//! The secret store's rows: each tenant's named secrets (table `secrets`) and the secrets bound
//! to each sandbox at create (table `sandbox_secrets`), values sealed under the relay's key.
//!
//! A tenant's value is sealed with its tenant and name as context, a bound value with its
//! sandbox and name, so a sealed value copied onto another row does not open. A sandbox's
//! bound secrets are deleted with its row by a trigger (whichever path deletes it: a client's
//! delete, the reaper, a journaled delete); those of a sandbox that was never recorded (a
//! create that failed after binding) are swept when the relay that created it starts. The rules for names and
//! values, and placeholders, are [`crate::egress::secrets`]'s.

use tether_client::api::SecretValue;

use super::backend::BoundRow;
use super::{NodeId, SandboxId, Store, StoreError, Tenant};
use tether_relay_core::egress::policy::{BoundSecret, HostPattern};

/// A stored secret without its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSecret {
    /// Its name.
    pub name: String,
    /// When it was first stored, ms since the Unix epoch.
    pub created_ms: i64,
    /// When its value was last set, ms since the Unix epoch.
    pub updated_ms: i64,
}

/// What a tenant's sealed value is bound to. Neither tenants nor names hold `:` or `/`, so no
/// tenant's context is a sandbox's, nor another tenant's.
fn tenant_context(tenant: &Tenant, name: &str) -> String {
    format!("secret:{tenant}/{name}")
}

/// What a bound sealed value is bound to.
fn bound_context(id: &str, name: &str) -> String {
    format!("bound:{id}/{name}")
}

impl Store {
    /// Stores `value` as the tenant's secret `name`, replacing the value it had, unless that
    /// would make the tenant hold more than `max` secrets. Returns the secret and whether it
    /// is new, or `None` when the store is full.
    pub async fn put_secret(
        &self,
        tenant: &Tenant,
        name: &str,
        value: &SecretValue,
        now_ms: i64,
        max: usize,
    ) -> Result<Option<(StoredSecret, bool)>, StoreError> {
        let sealed = self.key.seal(&tenant_context(tenant, name), value.expose());
        self.backend
            .put_secret(tenant.to_string(), name.to_string(), sealed, now_ms, max)
            .await
    }

    /// The tenant's secrets, by name, without their values.
    pub async fn secrets(&self, tenant: &Tenant) -> Result<Vec<StoredSecret>, StoreError> {
        self.backend.secrets(tenant.to_string()).await
    }

    /// The value of the tenant's secret `name`, if it has one.
    pub async fn secret_value(
        &self,
        tenant: &Tenant,
        name: &str,
    ) -> Result<Option<SecretValue>, StoreError> {
        let sealed = self
            .backend
            .secret_value(tenant.to_string(), name.to_string())
            .await?;
        match sealed {
            Some(sealed) => {
                let value = self.key.open(&tenant_context(tenant, name), &sealed)?;
                Ok(Some(SecretValue::new(value)))
            }
            None => Ok(None),
        }
    }

    /// Deletes the tenant's secret `name`. Returns whether it was there.
    pub async fn remove_secret(&self, tenant: &Tenant, name: &str) -> Result<bool, StoreError> {
        self.backend
            .remove_secret(tenant.to_string(), name.to_string())
            .await
    }

    /// Records `secrets` as sandbox `id`'s bound secrets, replacing any it had.
    pub async fn bind_secrets(
        &self,
        id: &SandboxId,
        secrets: &[BoundSecret],
    ) -> Result<(), StoreError> {
        let mut rows = Vec::with_capacity(secrets.len());
        for s in secrets {
            let hosts: Vec<String> = s.hosts.iter().map(ToString::to_string).collect();
            rows.push(BoundRow {
                name: s.name.clone(),
                placeholder: s.placeholder.clone(),
                value: self
                    .key
                    .seal(&bound_context(id.as_str(), &s.name), s.value.expose()),
                hosts: serde_json::to_string(&hosts)?,
            });
        }
        self.backend.bind_secrets(id.to_string(), rows).await
    }

    /// Sandbox `id`'s bound secrets, in the order they were bound.
    pub async fn bound_secrets(&self, id: &SandboxId) -> Result<Vec<BoundSecret>, StoreError> {
        let rows = self.backend.bound_secrets(id.to_string()).await?;
        rows.into_iter()
            .map(|row| {
                let value = self
                    .key
                    .open(&bound_context(id.as_str(), &row.name), &row.value)?;
                let hosts: Vec<String> = serde_json::from_str(&row.hosts)?;
                let hosts = hosts
                    .iter()
                    .map(|h| HostPattern::parse(h))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| {
                        StoreError::Corrupt(format!("a host of secret {}: {e}", row.name))
                    })?;
                Ok(BoundSecret {
                    name: row.name,
                    placeholder: row.placeholder,
                    value: SecretValue::new(value),
                    hosts,
                })
            })
            .collect()
    }

    /// Forgets sandbox `id`'s bound secrets (a create that failed after binding them).
    pub async fn unbind_secrets(&self, id: &SandboxId) -> Result<(), StoreError> {
        self.backend.unbind_secrets(id.to_string()).await
    }

    /// Forgets bound secrets whose sandbox the store does not hold and no other relay than
    /// `node` is creating: creates that failed (or a relay that stopped) between binding and
    /// recording. Only for relay `node` starting up, when it runs no create. Returns how many
    /// it forgot.
    pub async fn sweep_unbound_secrets(&self, node: &NodeId) -> Result<usize, StoreError> {
        self.backend.sweep_unbound_secrets(node.clone()).await
    }
}
