//! An allowlist (`"network": "allowlist"`) on a cloud provider: each provider maps it to its own
//! egress controls, in its `egress` module; what they share is here. Anything a provider
//! cannot express is refused: nothing is silently widened or dropped.
//!
//! A cloud sandbox's traffic does not pass the relay unless it is sent there: a sandbox with
//! secrets gets the relay's egress listener (`tether serve --egress-url`) as its HTTP proxy,
//! and the relay adds the listener's address to its allowlist before the provider sees the
//! spec (whose secrets it has by then taken out). A spec that still carries secrets here had
//! no such route, and is refused.

use tether_relay_core::egress::policy::Allowlist;
use tether_relay_core::provider::network::Guarantees;
use tether_relay_core::provider::{NetworkPolicy, ProviderError, SandboxSpec};

/// The allowlist of `spec` for `provider` (its display name), `None` when the spec has
/// another mode; refused when it binds secrets or is invalid.
pub(crate) fn allowlist(
    provider: &str,
    spec: &SandboxSpec,
) -> Result<Option<Allowlist>, ProviderError> {
    if !spec.secrets.is_empty() {
        let names: Vec<&str> = spec.secrets.iter().map(|s| s.name.as_str()).collect();
        return Err(ProviderError::InvalidSpec(format!(
            "{provider} cannot carry secrets ({}) without a route to the relay: a secret's \
             value is put into requests by the relay's egress proxy, which a {provider} sandbox \
             reaches only when the relay is started with --egress-url (the address at which \
             sandboxes reach it). Start the relay with --egress-url, create the sandbox with \
             --provider local, or leave --secret out",
            names.join(", ")
        )));
    }
    if spec.network != NetworkPolicy::Allowlist {
        return Ok(None);
    }
    Allowlist::from_spec(spec).map_err(ProviderError::InvalidSpec)
}

/// Adds what holds of the secrets of a sandbox of `provider` created from `spec` to
/// `guarantees`: nothing without secrets; with them, what the relay's egress proxy does for
/// the requests sent through it, and what it cannot do for the rest.
pub(crate) fn secrets_guarantees(provider: &str, spec: &SandboxSpec, guarantees: &mut Guarantees) {
    if spec.secrets.is_empty() {
        return;
    }
    guarantees.holds.extend([
        "secrets never enter the sandbox: it holds placeholders, and the relay's egress proxy \
         (its HTTPS_PROXY, with a credential of this sandbox's own) puts the values into HTTPS \
         requests to each secret's own hosts only"
            .to_string(),
        "requests sent through the relay's proxy reach allowed names only, checked by the \
         relay (TLS SNI and HTTP Host, names resolved by the relay)"
            .to_string(),
    ]);
    guarantees.not.extend([
        format!(
            "traffic that ignores the proxy variables (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY) goes \
             direct, subject only to {provider}'s allowlist, and carries placeholders, never \
             values"
        ),
        format!(
            "{provider}'s allowlist is not narrowed to the relay: it holds the allowed names \
             and networks, and the relay's egress address besides"
        ),
        "the proxy credential is in the sandbox's environment: code inside can hand it out, \
         and whoever holds it can use the relay's proxy as this sandbox (its allowlist, its \
         secrets) until the sandbox is deleted"
            .to_string(),
        "requests through the relay's proxy leave from the relay's host, not from the \
         sandbox's network"
            .to_string(),
    ]);
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
        assert!(err.contains("--egress-url"), "{err}");
        assert!(err.contains("--provider local"), "{err}");
    }

    #[test]
    fn secrets_state_what_the_relay_does_and_what_goes_around_it() {
        let mut none = Guarantees::default();
        secrets_guarantees("E2B", &SandboxSpec::default(), &mut none);
        assert_eq!(none, Guarantees::default());
        let spec = SandboxSpec {
            network: NetworkPolicy::Allowlist,
            secrets: vec![SecretSpec {
                name: "KEY".into(),
                hosts: vec!["api.test".into()],
                value: None,
            }],
            ..SandboxSpec::default()
        };
        let mut some = Guarantees::default();
        secrets_guarantees("E2B", &spec, &mut some);
        assert!(some.holds.iter().any(|g| g.contains("never enter")));
        assert!(some
            .not
            .iter()
            .any(|g| g.contains("goes direct") && g.contains("E2B's allowlist")));
        assert!(some.not.iter().any(|g| g.contains("not narrowed")));
        assert!(some.not.iter().any(|g| g.contains("credential")));
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
