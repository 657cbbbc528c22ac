//! Secrets by placeholder, bound to a sandbox when it is created: each secret a create request
//! names gets its value (from the request, else the tenant's secret store), a random
//! placeholder that the sandbox sees in its environment instead, and a sealed record in the
//! store so a restarted relay finds the binding again ([`bind`], [`load`]).
//!
//! The value never enters the sandbox or the stored spec: the egress proxy swaps the
//! placeholder for it on the way out, in requests to the secret's hosts only.

use tether_client::api::{check_secret_name, check_secret_value, SandboxSpec};
use tether_relay_core::egress::policy::{BoundSecret, HostPattern, PLACEHOLDER_PREFIX};
use tether_store::{SandboxId, Store, StoreError, Tenant};

use crate::ApiError;

/// Random bytes in a placeholder: 128 bits, written as 32 hex digits.
const PLACEHOLDER_RANDOM_BYTES: usize = 16;
/// Secrets one sandbox may be given: the proxy looks for each placeholder in every request.
pub(crate) const MAX_SECRETS_PER_SANDBOX: usize = 64;

/// A fresh placeholder: [`PLACEHOLDER_PREFIX`] and 32 random hex digits.
pub(crate) fn placeholder() -> String {
    // `rand::random` draws from the thread-local CSPRNG, seeded from the OS.
    let random: [u8; PLACEHOLDER_RANDOM_BYTES] = rand::random();
    format!("{PLACEHOLDER_PREFIX}{}", hex::encode(random))
}

/// Resolves `spec.secrets` for a new sandbox: each value from the request, else from the
/// tenant's store (a 400-style error naming what to do if neither); makes a placeholder
/// (`tether-secret-` + 32 random hex digits); sets `spec.env[name] = placeholder` (refusing a
/// name already in `spec.env`); clears every `value` from `spec`; seals and records the bound
/// secrets for sandbox `id` so a restarted relay can `load` them.
///
/// Nothing in `spec` changes unless every secret binds. A create that fails after this call
/// should [`unbind`]; if it cannot, the next relay start forgets the binding anyway.
pub(crate) async fn bind(
    store: &Store,
    tenant: &Tenant,
    id: &SandboxId,
    spec: &mut SandboxSpec,
) -> Result<Vec<BoundSecret>, ApiError> {
    if spec.secrets.is_empty() {
        return Ok(Vec::new());
    }
    if spec.secrets.len() > MAX_SECRETS_PER_SANDBOX {
        return Err(ApiError::Invalid(format!(
            "a sandbox takes at most {MAX_SECRETS_PER_SANDBOX} secrets, and the request names {}",
            spec.secrets.len()
        )));
    }
    let mut bound: Vec<BoundSecret> = Vec::with_capacity(spec.secrets.len());
    for secret in &spec.secrets {
        let name = secret.name.as_str();
        check_secret_name(name).map_err(ApiError::Invalid)?;
        if bound.iter().any(|b| b.name == name) {
            return Err(ApiError::Invalid(format!(
                "secret {name} is named twice; name each secret once, with all its hosts"
            )));
        }
        if spec.env.contains_key(name) {
            return Err(ApiError::Invalid(format!(
                "secret {name} would set the environment variable {name}, which the request \
                 also sets (env / --env); drop one of the two"
            )));
        }
        if secret.hosts.is_empty() {
            return Err(ApiError::Invalid(format!(
                "secret {name} is bound to no host, so it could never be sent anywhere; name \
                 the hosts it is for, e.g. {name}@api.openai.com"
            )));
        }
        let hosts = secret
            .hosts
            .iter()
            .map(|h| HostPattern::parse(h).map_err(|e| format!("secret {name}: {e}")))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ApiError::Invalid)?;
        let value = match &secret.value {
            Some(value) => {
                check_secret_value(name, value.expose()).map_err(ApiError::Invalid)?;
                value.clone()
            }
            None => store
                .secret_value(tenant, name)
                .await?
                .ok_or_else(|| missing(tenant, name))?,
        };
        bound.push(BoundSecret {
            name: name.to_string(),
            placeholder: placeholder(),
            value,
            hosts,
        });
    }
    store.bind_secrets(id, &bound).await?;
    for (secret, b) in spec.secrets.iter_mut().zip(&bound) {
        secret.value = None;
        spec.env.insert(b.name.clone(), b.placeholder.clone());
    }
    Ok(bound)
}

/// The bound secrets of sandbox `id`, as [`bind`] recorded them (none for a sandbox that has
/// none), for a relay that restarted.
pub(crate) async fn load(store: &Store, id: &SandboxId) -> Result<Vec<BoundSecret>, StoreError> {
    store.bound_secrets(id).await
}

/// Forgets the bound secrets of sandbox `id`, for a create that failed after [`bind`]. (The
/// store forgets those of a recorded sandbox by itself when the sandbox is deleted.)
pub(crate) async fn unbind(store: &Store, id: &SandboxId) -> Result<(), StoreError> {
    store.unbind_secrets(id).await
}

/// The 400 for a secret that has no value anywhere.
fn missing(tenant: &Tenant, name: &str) -> ApiError {
    ApiError::Invalid(format!(
        "secret {name} has no value: the request sent none and tenant {tenant}'s secret store \
         holds none; store it on the relay with `tether secret set {name}` (the value read \
         from stdin), or export {name} where you run `tether create` to send your own"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_client::api::{SecretSpec, SecretValue};

    use tether_relay_core::provider::NetworkPolicy;

    const STORED: &str = "sk-stored-Hj2kL5mN8bV1cX4z";
    const SENT: &str = "sk-sent-Qw3eR6tY9uI2oP5a";

    fn tenant(name: &str) -> Tenant {
        Tenant::parse(name).unwrap()
    }

    fn secret(name: &str, host: &str, value: Option<&str>) -> SecretSpec {
        SecretSpec {
            name: name.into(),
            hosts: vec![host.into()],
            value: value.map(SecretValue::new),
        }
    }

    fn spec(secrets: Vec<SecretSpec>) -> SandboxSpec {
        SandboxSpec {
            network: NetworkPolicy::Allowlist,
            secrets,
            ..SandboxSpec::default()
        }
    }

    /// A store whose tenant `a` stores OPENAI_API_KEY.
    async fn registry_with_stored(path: &std::path::Path) -> Store {
        let reg = Store::open(path).unwrap();
        let value = SecretValue::new(STORED);
        let a = tenant("a");
        let put = reg.put_secret(&a, "OPENAI_API_KEY", &value, 1, 8);
        assert!(put.await.unwrap().is_some());
        reg
    }

    fn invalid(err: ApiError) -> String {
        match err {
            ApiError::Invalid(msg) => msg,
            other => panic!("not a 400: {other:?}"),
        }
    }

    #[tokio::test]
    async fn binds_placeholders_clears_values_and_loads_them_after_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.db");
        let reg = registry_with_stored(&path).await;
        let id = SandboxId::generate();
        let mut spec = spec(vec![
            secret("OPENAI_API_KEY", "api.openai.com", None),
            secret("GITHUB_TOKEN", "*.github.com", Some(SENT)),
        ]);
        spec.env.insert("LANG".into(), "C.UTF-8".into());
        let bound = bind(&reg, &tenant("a"), &id, &mut spec).await.unwrap();

        assert_eq!(bound.len(), 2);
        assert_eq!(bound[0].value.expose(), STORED, "from the store");
        assert_eq!(bound[1].value.expose(), SENT, "from the request");
        assert_eq!(
            bound[1].hosts,
            [HostPattern::parse("*.github.com").unwrap()]
        );
        for b in &bound {
            let random = b.placeholder.strip_prefix(PLACEHOLDER_PREFIX).unwrap();
            assert!(
                random.len() == 32 && random.bytes().all(|c| c.is_ascii_hexdigit()),
                "{}",
                b.placeholder
            );
            assert_eq!(spec.env[&b.name], b.placeholder);
        }
        assert_ne!(bound[0].placeholder, bound[1].placeholder);
        assert_eq!(spec.env["LANG"], "C.UTF-8");
        assert!(spec.secrets.iter().all(|s| s.value.is_none()));
        let shown = format!(
            "{spec:?} {bound:?} {}",
            serde_json::to_string(&spec).unwrap()
        );
        assert!(!shown.contains(STORED) && !shown.contains(SENT), "{shown}");

        drop(reg);
        let reg = Store::open(&path).unwrap();
        assert_eq!(load(&reg, &id).await.unwrap(), bound);
        assert!(load(&reg, &SandboxId::generate()).await.unwrap().is_empty());
        unbind(&reg, &id).await.unwrap();
        assert!(load(&reg, &id).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_value_in_the_request_beats_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry_with_stored(&dir.path().join("relay.db")).await;
        let mut spec = spec(vec![secret("OPENAI_API_KEY", "api.openai.com", Some(SENT))]);
        let bound = bind(&reg, &tenant("a"), &SandboxId::generate(), &mut spec)
            .await
            .unwrap();
        assert_eq!(bound[0].value.expose(), SENT);
    }

    #[tokio::test]
    async fn a_secret_with_no_value_anywhere_says_how_to_give_one() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registry_with_stored(&dir.path().join("relay.db")).await;
        // Tenant b cannot read a's secret through a create.
        for (who, name) in [("b", "OPENAI_API_KEY"), ("a", "MISSING_KEY")] {
            let mut spec = spec(vec![secret(name, "api.openai.com", None)]);
            let before = spec.clone();
            let err = bind(&reg, &tenant(who), &SandboxId::generate(), &mut spec)
                .await
                .unwrap_err();
            let msg = invalid(err);
            assert!(
                msg.contains(&format!("tether secret set {name}"))
                    && msg.contains(&format!("export {name}")),
                "{msg}"
            );
            assert!(!msg.contains(STORED), "{msg}");
            assert_eq!(spec, before, "nothing changed");
        }
    }

    #[tokio::test]
    async fn refuses_what_cannot_be_bound_and_changes_nothing() {
        let reg = Store::open_in_memory().unwrap();
        let t = tenant("a");
        let long = "A".repeat(129);
        let cases: Vec<(SandboxSpec, &str)> = vec![
            (
                {
                    let mut s = spec(vec![secret("KEY", "a.test", Some(SENT))]);
                    s.env.insert("KEY".into(), "set by env".into());
                    s
                },
                "also sets",
            ),
            (
                spec(vec![
                    secret("KEY", "a.test", Some(SENT)),
                    secret("KEY", "b.test", Some(SENT)),
                ]),
                "named twice",
            ),
            (
                spec(vec![secret("1KEY", "a.test", Some(SENT))]),
                "environment variable",
            ),
            (
                spec(vec![secret("A-B", "a.test", Some(SENT))]),
                "environment variable",
            ),
            (spec(vec![secret(&long, "a.test", Some(SENT))]), "128 bytes"),
            (spec(vec![secret("KEY", "*.com", Some(SENT))]), "top-level"),
            (
                spec(vec![SecretSpec {
                    hosts: vec![],
                    ..secret("KEY", "a.test", Some(SENT))
                }]),
                "no host",
            ),
            (spec(vec![secret("KEY", "a.test", Some(""))]), "empty"),
            (spec(vec![secret("KEY", "a.test", Some("a\0b"))]), "NUL"),
            (
                spec(
                    (0..=MAX_SECRETS_PER_SANDBOX)
                        .map(|n| secret(&format!("KEY_{n}"), "a.test", Some(SENT)))
                        .collect(),
                ),
                "at most 64 secrets",
            ),
            (
                spec(vec![secret(
                    "KEY",
                    "a.test",
                    Some(&"x".repeat(64 * 1024 + 1)),
                )]),
                "64 KiB",
            ),
        ];
        for (mut spec, words) in cases {
            let before = spec.clone();
            let id = SandboxId::generate();
            let msg = invalid(bind(&reg, &t, &id, &mut spec).await.unwrap_err());
            assert!(msg.contains(words), "{words:?} not in {msg}");
            assert!(!msg.contains(SENT), "{msg}");
            assert_eq!(spec, before, "nothing changed");
            assert!(
                load(&reg, &id).await.unwrap().is_empty(),
                "nothing recorded"
            );
        }
    }

    #[tokio::test]
    async fn a_spec_without_secrets_binds_nothing() {
        let reg = Store::open_in_memory().unwrap();
        let mut spec = SandboxSpec::default();
        let id = SandboxId::generate();
        assert!(bind(&reg, &tenant("a"), &id, &mut spec)
            .await
            .unwrap()
            .is_empty());
        assert_eq!(spec, SandboxSpec::default());
    }
}
