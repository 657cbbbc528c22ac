//! An allowlist (`"network": "allowlist"`) on a cloud provider: each provider maps it to its own
//! egress controls, in its `egress` module; what they share is here. A cloud sandbox's traffic
//! does not pass the relay, so secrets (which the relay's egress proxy puts in requests) are
//! refused, as is anything a provider cannot express: nothing is silently widened or dropped.

use crate::egress::policy::Allowlist;
use crate::provider::{NetworkPolicy, ProviderError, SandboxSpec};

/// The allowlist of `spec` for `provider` (its display name), `None` when the spec has
/// another mode; refused when it binds secrets or is invalid.
pub(crate) fn allowlist(
    provider: &str,
    spec: &SandboxSpec,
) -> Result<Option<Allowlist>, ProviderError> {
    if !spec.secrets.is_empty() {
        let names: Vec<&str> = spec.secrets.iter().map(|s| s.name.as_str()).collect();
        return Err(ProviderError::InvalidSpec(format!(
            "{provider} cannot carry secrets ({}): a secret's value is put into requests by the \
             relay's egress proxy, and a {provider} sandbox's traffic does not pass the relay. \
             Create the sandbox with --provider local to use secrets, or leave --secret out",
            names.join(", ")
        )));
    }
    if spec.network != NetworkPolicy::Allowlist {
        return Ok(None);
    }
    Allowlist::from_spec(spec).map_err(ProviderError::InvalidSpec)
}

/// The refusal of something `provider` cannot express, saying what to do instead.
pub(crate) fn refuse(provider: &str, what: &str, instead: &str) -> ProviderError {
    ProviderError::InvalidSpec(format!(
        "{provider}'s egress controls cannot express {what}; {instead}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_client::api::{EgressSpec, SecretSpec};

    #[test]
    fn secrets_are_refused_naming_the_provider_and_what_to_do() {
        let spec = SandboxSpec {
            network: NetworkPolicy::Allowlist,
            secrets: vec![SecretSpec {
                name: "OPENAI_API_KEY".into(),
                hosts: vec!["api.openai.com".into()],
                value: None,
            }],
            ..SandboxSpec::default()
        };
        let err = allowlist("Modal", &spec).unwrap_err().to_string();
        assert!(
            err.contains("Modal cannot carry secrets (OPENAI_API_KEY)"),
            "{err}"
        );
        assert!(err.contains("--provider local"), "{err}");
    }

    #[test]
    fn other_modes_have_no_allowlist_and_bad_entries_are_refused() {
        assert!(allowlist("E2B", &SandboxSpec::default()).unwrap().is_none());
        let empty = SandboxSpec {
            network: NetworkPolicy::Allowlist,
            ..SandboxSpec::default()
        };
        assert_eq!(
            allowlist("E2B", &empty).unwrap(),
            Some(Allowlist::default())
        );
        let bad = SandboxSpec {
            network: NetworkPolicy::Allowlist,
            egress: EgressSpec {
                allow_hosts: vec![],
                allow_cidrs: vec!["10.1.2.3/16".into()],
            },
            ..SandboxSpec::default()
        };
        assert!(matches!(
            allowlist("E2B", &bad),
            Err(ProviderError::InvalidSpec(m)) if m.contains("10.1.0.0/16")
        ));
    }
}
