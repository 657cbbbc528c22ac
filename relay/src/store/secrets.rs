//! The secret store's rows: each tenant's named secrets (table `secrets`) and the secrets bound
//! to each sandbox at create (table `sandbox_secrets`), values sealed under the relay's key.
//!
//! A tenant's value is sealed with its tenant and name as context, a bound value with its
//! sandbox and name, so a sealed value copied onto another row does not open. A sandbox's
//! bound secrets are deleted with its row by a trigger (whichever path deletes it: a client's
//! delete, the reaper, a journaled delete); those of a sandbox that was never recorded (a
//! create that failed after binding) are swept when the relay starts. The rules for names and
//! values, and placeholders, are [`crate::egress::secrets`]'s.

use rusqlite::types::Type;
use rusqlite::{params, OptionalExtension};
use tether_client::api::SecretValue;

use super::{Registry, RegistryError, SandboxId, Tenant};
use crate::egress::policy::{BoundSecret, HostPattern};

/// A stored secret without its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredSecret {
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

impl Registry {
    /// Stores `value` as the tenant's secret `name`, replacing the value it had, unless that
    /// would make the tenant hold more than `max` secrets. Returns the secret and whether it
    /// is new, or `None` when the store is full.
    pub(crate) async fn put_secret(
        &self,
        tenant: &Tenant,
        name: &str,
        value: &SecretValue,
        now_ms: i64,
        max: usize,
    ) -> Result<Option<(StoredSecret, bool)>, RegistryError> {
        let sealed = self.key.seal(&tenant_context(tenant, name), value.expose());
        let (tenant, name) = (tenant.clone(), name.to_string());
        self.call(move |db| {
            let tx = db.transaction()?;
            let created: Option<i64> = tx
                .query_row(
                    "SELECT created_ms FROM secrets WHERE tenant = ?1 AND name = ?2",
                    params![tenant.as_str(), name],
                    |row| row.get(0),
                )
                .optional()?;
            if created.is_none() {
                // In the transaction, so two concurrent puts cannot both take the last place.
                let held: i64 = tx.query_row(
                    "SELECT count(*) FROM secrets WHERE tenant = ?1",
                    [tenant.as_str()],
                    |row| row.get(0),
                )?;
                if usize::try_from(held).unwrap_or(usize::MAX) >= max {
                    return Ok(None);
                }
            }
            tx.execute(
                "INSERT INTO secrets (tenant, name, value, created_ms, updated_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?4) \
                 ON CONFLICT (tenant, name) DO UPDATE \
                 SET value = excluded.value, updated_ms = excluded.updated_ms",
                params![tenant.as_str(), name, sealed, now_ms],
            )?;
            tx.commit()?;
            let stored = StoredSecret {
                name,
                created_ms: created.unwrap_or(now_ms),
                updated_ms: now_ms,
            };
            Ok(Some((stored, created.is_none())))
        })
        .await
    }

    /// The tenant's secrets, by name, without their values.
    pub(crate) async fn secrets(
        &self,
        tenant: &Tenant,
    ) -> Result<Vec<StoredSecret>, RegistryError> {
        let tenant = tenant.clone();
        self.call(move |db| {
            let mut stmt = db.prepare_cached(
                "SELECT name, created_ms, updated_ms FROM secrets WHERE tenant = ?1 ORDER BY name",
            )?;
            let rows = stmt.query_map([tenant.as_str()], |row| {
                Ok(StoredSecret {
                    name: row.get(0)?,
                    created_ms: row.get(1)?,
                    updated_ms: row.get(2)?,
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// The value of the tenant's secret `name`, if it has one.
    pub(crate) async fn secret_value(
        &self,
        tenant: &Tenant,
        name: &str,
    ) -> Result<Option<SecretValue>, RegistryError> {
        let context = tenant_context(tenant, name);
        let (tenant, name) = (tenant.clone(), name.to_string());
        let key = self.key.clone();
        self.call(move |db| {
            let sealed: Option<String> = db
                .query_row(
                    "SELECT value FROM secrets WHERE tenant = ?1 AND name = ?2",
                    params![tenant.as_str(), name],
                    |row| row.get(0),
                )
                .optional()?;
            match sealed {
                Some(sealed) => Ok(Some(SecretValue::new(key.open(&context, &sealed)?))),
                None => Ok(None),
            }
        })
        .await
    }

    /// Deletes the tenant's secret `name`. Returns whether it was there.
    pub(crate) async fn remove_secret(
        &self,
        tenant: &Tenant,
        name: &str,
    ) -> Result<bool, RegistryError> {
        let (tenant, name) = (tenant.clone(), name.to_string());
        self.call(move |db| {
            Ok(db.execute(
                "DELETE FROM secrets WHERE tenant = ?1 AND name = ?2",
                params![tenant.as_str(), name],
            )? > 0)
        })
        .await
    }

    /// Records `secrets` as sandbox `id`'s bound secrets, replacing any it had.
    pub(crate) async fn bind_secrets(
        &self,
        id: &SandboxId,
        secrets: &[BoundSecret],
    ) -> Result<(), RegistryError> {
        let mut rows = Vec::with_capacity(secrets.len());
        for s in secrets {
            let sealed = self
                .key
                .seal(&bound_context(id.as_str(), &s.name), s.value.expose());
            let hosts: Vec<String> = s.hosts.iter().map(ToString::to_string).collect();
            rows.push((
                s.name.clone(),
                s.placeholder.clone(),
                sealed,
                serde_json::to_string(&hosts)?,
            ));
        }
        let id = id.clone();
        self.call(move |db| {
            let tx = db.transaction()?;
            tx.execute(
                "DELETE FROM sandbox_secrets WHERE sandbox_id = ?1",
                [id.as_str()],
            )?;
            for (name, placeholder, sealed, hosts) in &rows {
                tx.execute(
                    "INSERT INTO sandbox_secrets (sandbox_id, name, placeholder, value, hosts) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![id.as_str(), name, placeholder, sealed, hosts],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// Sandbox `id`'s bound secrets, in the order they were bound.
    pub(crate) async fn bound_secrets(
        &self,
        id: &SandboxId,
    ) -> Result<Vec<BoundSecret>, RegistryError> {
        let id = id.clone();
        let key = self.key.clone();
        self.call(move |db| {
            let mut stmt = db.prepare_cached(
                "SELECT name, placeholder, value, hosts FROM sandbox_secrets \
                 WHERE sandbox_id = ?1 ORDER BY rowid",
            )?;
            let rows = stmt.query_map([id.as_str()], |row| {
                let name: String = row.get(0)?;
                let sealed: String = row.get(2)?;
                let value = key
                    .open(&bound_context(id.as_str(), &name), &sealed)
                    .map_err(|e| {
                        rusqlite::Error::FromSqlConversionFailure(2, Type::Text, Box::new(e))
                    })?;
                let hosts: Vec<String> = super::json_column(row, 3)?;
                let hosts = hosts
                    .iter()
                    .map(|h| HostPattern::parse(h))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| {
                        rusqlite::Error::FromSqlConversionFailure(3, Type::Text, e.into())
                    })?;
                Ok(BoundSecret {
                    name,
                    placeholder: row.get(1)?,
                    value: SecretValue::new(value),
                    hosts,
                })
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// Forgets sandbox `id`'s bound secrets (a create that failed after binding them).
    pub(crate) async fn unbind_secrets(&self, id: &SandboxId) -> Result<(), RegistryError> {
        let id = id.clone();
        self.call(move |db| {
            db.execute(
                "DELETE FROM sandbox_secrets WHERE sandbox_id = ?1",
                [id.as_str()],
            )?;
            Ok(())
        })
        .await
    }

    /// Forgets bound secrets whose sandbox the registry does not hold: creates that failed
    /// (or a relay that stopped) between binding and recording. Only for a relay starting up,
    /// when no create is under way. Returns how many it forgot.
    pub(crate) async fn sweep_unbound_secrets(&self) -> Result<usize, RegistryError> {
        self.call(|db| {
            Ok(db.execute(
                "DELETE FROM sandbox_secrets WHERE sandbox_id NOT IN (SELECT id FROM sandboxes)",
                [],
            )?)
        })
        .await
    }
}
