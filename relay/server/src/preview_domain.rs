//! The domain a relay serves previews under by host name besides `localhost`
//! (`tether serve --preview-domain`): what makes a name one, checked once at start. Below
//! both the relay's state, which holds it, and the preview routes, which match hosts with it.

/// The name every machine resolves to itself (RFC 6761): the host form's domain by default.
pub(crate) const LOCALHOST: &str = "localhost";
/// The longest preview domain: room is left for the `{port}-{id}.` label within DNS's 253.
const PREVIEW_DOMAIN_MAX: usize = 180;

/// A DNS domain under which the relay serves previews by host name besides `localhost`:
/// `{port}-{id}.{domain}`. Lowercase, without a trailing dot; each label 1 to 63 letters,
/// digits or inner hyphens; at least two labels (a wildcard record lives under a domain).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreviewDomain(String);

impl PreviewDomain {
    /// The domain, e.g. `preview.example.com`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for PreviewDomain {
    type Err = String;

    fn from_str(given: &str) -> Result<Self, String> {
        let wanted = "give a DNS name such as preview.example.com, whose wildcard record \
                      *.preview.example.com points at this relay";
        let name = given
            .strip_suffix('.')
            .unwrap_or(given)
            .to_ascii_lowercase();
        let labels: Vec<&str> = name.split('.').collect();
        let fault = if name.is_empty() {
            Some("it is empty".to_string())
        } else if name.len() > PREVIEW_DOMAIN_MAX {
            Some(format!("it is longer than {PREVIEW_DOMAIN_MAX} characters"))
        } else if labels.len() < 2 {
            Some("it has one label; a wildcard DNS record needs a domain under it".to_string())
        } else if let Some(bad) = labels.iter().find(|l| !valid_label(l)) {
            Some(format!(
                "{bad:?} is not a DNS label (1 to 63 letters, digits and inner hyphens)"
            ))
        } else if labels.last() == Some(&LOCALHOST) {
            Some("previews are served under localhost already".to_string())
        } else {
            None
        };
        match fault {
            Some(fault) => Err(format!(
                "{given:?} cannot be a preview domain: {fault}; {wanted}"
            )),
            None => Ok(PreviewDomain(name)),
        }
    }
}

/// Whether `label` is one DNS label of a host name (RFC 1123: letters, digits and hyphens,
/// neither first nor last a hyphen, at most 63).
fn valid_label(label: &str) -> bool {
    (1..=63).contains(&label.len())
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-')
}
