//! Named sets of hosts an allowlist may name instead of the hosts themselves:
//! `@package-registries` in `allow_hosts` (the CLI's `--allow-host @package-registries`).
//!
//! A preset is expanded here, into host names, once: the relay expands a create's presets
//! before its policy checks the allowlist (so a tenant's `egress_hosts` bounds a preset's
//! hosts like any other, and a preset never reaches around them), and keeps the expanded
//! spec, which is what `tether info`, the egress proxy and the providers see. Nothing after
//! expansion knows presets, except the proxy's refusals, which name the preset that holds a
//! refused host.

/// What starts a preset in `allow_hosts`. A host name pattern never holds it, so an entry
/// is either a preset or a pattern, never both.
pub const PRESET_SIGIL: char = '@';

/// A named set of exact host names.
#[derive(Debug)]
pub struct Preset {
    /// Its name, without [`PRESET_SIGIL`]: lowercase letters and `-`.
    pub name: &'static str,
    /// What it is for, in a few words, for messages and docs.
    pub covers: &'static str,
    /// The exact names it allows; no wildcards, so it allows no name the list does not show.
    pub hosts: &'static [&'static str],
}

/// Every preset. Its hosts are what the registries' own clients reach by default: pip (the
/// index at pypi.org, files at files.pythonhosted.org), npm (metadata and tarballs at
/// registry.npmjs.org), apt on Debian (deb.debian.org, security.debian.org) and cargo's sparse
/// index (index.crates.io, downloads at static.crates.io). crates.io itself (the web API,
/// for `cargo publish` and `cargo search`) is left out: fetching needs only the two above.
pub const PRESETS: &[Preset] = &[Preset {
    name: "package-registries",
    covers: "PyPI, npm, Debian and crates.io",
    hosts: &[
        "pypi.org",
        "files.pythonhosted.org",
        "registry.npmjs.org",
        "deb.debian.org",
        "security.debian.org",
        "index.crates.io",
        "static.crates.io",
    ],
}];

impl Preset {
    /// How an allowlist names it: `@package-registries`.
    pub fn reference(&self) -> String {
        format!("{PRESET_SIGIL}{}", self.name)
    }
}

/// The preset `reference` (`@name`) names, or why none does. Names are matched exactly:
/// `@Package-Registries` is refused rather than guessed at.
pub fn find(reference: &str) -> Result<&'static Preset, String> {
    let name = reference.strip_prefix(PRESET_SIGIL).unwrap_or(reference);
    PRESETS.iter().find(|p| p.name == name).ok_or_else(|| {
        let known: Vec<String> = PRESETS
            .iter()
            .map(|p| format!("{} ({})", p.reference(), p.covers))
            .collect();
        format!(
            "`{reference}` is not a preset of allowed hosts; the presets are: {}",
            known.join(", ")
        )
    })
}

/// The presets that hold `host` (any case, trailing dot or not), for a refusal that names
/// the one that would allow it.
pub fn holding(host: &str) -> impl Iterator<Item = &'static Preset> + '_ {
    let host = host.trim_end_matches('.');
    PRESETS
        .iter()
        .filter(move |p| p.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)))
}

/// `allow_hosts` with every preset replaced by its hosts, in place, each name once; other
/// entries are kept as they are (they are checked as patterns later). An unknown preset is an
/// error naming the known ones.
pub fn expand(allow_hosts: &[String]) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::with_capacity(allow_hosts.len());
    for entry in allow_hosts {
        if entry.starts_with(PRESET_SIGIL) {
            for host in find(entry)?.hosts {
                if !out.iter().any(|h| h == host) {
                    out.push(host.to_string());
                }
            }
        } else if !out.contains(entry) {
            out.push(entry.clone());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::policy::HostPattern;
    use super::*;

    #[test]
    fn the_registries_preset_expands_to_its_hosts_and_keeps_the_others() {
        let given = vec![
            "api.openai.com".to_string(),
            "@package-registries".to_string(),
            "pypi.org".to_string(),
        ];
        let hosts = expand(&given).unwrap();
        assert_eq!(hosts[0], "api.openai.com");
        assert_eq!(hosts.len(), 1 + PRESETS[0].hosts.len(), "{hosts:?}");
        for name in ["pypi.org", "files.pythonhosted.org", "registry.npmjs.org"] {
            assert!(hosts.iter().any(|h| h == name), "{name} missing: {hosts:?}");
        }
        for name in ["deb.debian.org", "security.debian.org", "index.crates.io"] {
            assert!(hosts.iter().any(|h| h == name), "{name} missing: {hosts:?}");
        }
    }

    #[test]
    fn every_presets_hosts_are_exact_valid_names() {
        for preset in PRESETS {
            assert!(preset
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'-'));
            for host in preset.hosts {
                assert_eq!(
                    HostPattern::parse(host),
                    Ok(HostPattern::Exact(host.to_string()))
                );
            }
        }
    }

    #[test]
    fn nothing_rides_along_with_a_preset_name() {
        for smuggled in [
            "@package-registries,evil.com",
            "@package-registries evil.com",
            "@package-registries.evil.com",
            "@../package-registries",
            "@../x",
            "@Package-Registries",
            "@PACKAGE-REGISTRIES",
            "@package-registries\n",
            "@package-registries/",
            "@*",
            "@",
            "@@package-registries",
        ] {
            let why = expand(&[smuggled.to_string()]).unwrap_err();
            assert!(
                why.contains("@package-registries (PyPI, npm"),
                "{smuggled:?}: {why}"
            );
        }
    }

    #[test]
    fn a_refused_host_names_the_preset_that_holds_it() {
        let names: Vec<&str> = holding("PyPI.org.").map(|p| p.name).collect();
        assert_eq!(names, ["package-registries"]);
        assert_eq!(holding("evil.com").count(), 0);
        assert_eq!(holding("x.pypi.org").count(), 0);
    }
}
