//! The fake's Modal Secrets: `SecretGetOrCreate` (anonymous ones from a dict, as the SDKs'
//! `Secret.from_dict` makes them, and named ones), and the env a sandbox gets from the
//! Secrets it names. This is the only way env reaches a fake sandbox, as with the official
//! clients: `Sandbox.environment_variables` is not read.

use std::collections::{BTreeMap, HashMap};

use tonic::Status;

use super::pb::{ObjectCreationType, SecretGetOrCreateRequest, SecretGetOrCreateResponse};
use super::service::{Service, BASE62};
use crate::sandboxes::random_id;

/// Every Secret of the fake.
#[derive(Default)]
pub(super) struct SecretTable {
    /// Secret id → its env.
    by_id: HashMap<String, BTreeMap<String, String>>,
    /// `environment/name` → secret id, for named Secrets.
    by_name: HashMap<String, String>,
}

impl Service {
    /// `SecretGetOrCreate`, as Modal answers it: an anonymous Secret needs an env (and, owned
    /// by an app, an app that exists); a named one is looked up, made or replaced by its
    /// creation type; `required_keys` must all be there.
    pub(super) fn secret_get_or_create_in(
        &self,
        req: SecretGetOrCreateRequest,
    ) -> Result<SecretGetOrCreateResponse, Status> {
        let fake = &self.0;
        let kind = ObjectCreationType::try_from(req.object_creation_type)
            .map_err(|_| Status::invalid_argument("unknown object creation type"))?;
        let env: BTreeMap<String, String> = req.env_dict.into_iter().collect();
        if let Some(bad) = env.keys().find(|k| k.is_empty() || k.contains('=')) {
            return Err(Status::invalid_argument(format!(
                "invalid environment variable name {bad:?}"
            )));
        }
        let mut table = fake.secrets.lock().expect("secret table");
        let new_id = || format!("st-{}", random_id(22, BASE62));
        let secret_id = match kind {
            ObjectCreationType::AnonymousOwnedByApp | ObjectCreationType::Ephemeral => {
                if !req.deployment_name.is_empty() {
                    return Err(Status::invalid_argument(
                        "an anonymous Secret cannot have a name",
                    ));
                }
                if kind == ObjectCreationType::AnonymousOwnedByApp {
                    let apps = fake.apps.lock().expect("apps");
                    if !apps.values().any(|id| *id == req.app_id) {
                        return Err(Status::not_found(format!("App {} not found", req.app_id)));
                    }
                }
                let id = new_id();
                table.by_id.insert(id.clone(), env);
                id
            }
            _ => {
                if req.deployment_name.is_empty() {
                    return Err(Status::invalid_argument("a Secret needs a name"));
                }
                let environment = if req.environment_name.is_empty() {
                    "main"
                } else {
                    req.environment_name.as_str()
                };
                let key = format!("{environment}/{}", req.deployment_name);
                let existing = table.by_name.get(&key).cloned();
                match (kind, existing) {
                    (ObjectCreationType::CreateFailIfExists, Some(_)) => {
                        return Err(Status::already_exists(format!(
                            "Secret '{}' already exists",
                            req.deployment_name
                        )))
                    }
                    (ObjectCreationType::CreateOverwriteIfExists, Some(id)) => {
                        table.by_id.insert(id.clone(), env);
                        id
                    }
                    (_, Some(id)) => id,
                    (ObjectCreationType::Unspecified, None) => {
                        return Err(Status::not_found(format!(
                            "Secret '{}' not found",
                            req.deployment_name
                        )))
                    }
                    (_, None) => {
                        let id = new_id();
                        table.by_id.insert(id.clone(), env);
                        table.by_name.insert(key, id.clone());
                        id
                    }
                }
            }
        };
        let keys = &table.by_id[&secret_id];
        if let Some(missing) = req.required_keys.iter().find(|k| !keys.contains_key(*k)) {
            return Err(Status::not_found(format!(
                "Secret is missing the key {missing}"
            )));
        }
        Ok(SecretGetOrCreateResponse { secret_id })
    }

    /// The env of Secrets `ids`, later ones winning, as Modal applies them.
    pub(super) fn secret_env(&self, ids: &[String]) -> Result<BTreeMap<String, String>, Status> {
        let table = self.0.secrets.lock().expect("secret table");
        let mut env = BTreeMap::new();
        for id in ids {
            let secret = table
                .by_id
                .get(id)
                .ok_or_else(|| Status::not_found(format!("Secret {id} not found")))?;
            env.extend(secret.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        Ok(env)
    }
}
