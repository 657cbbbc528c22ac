//! The `@package-registries` preset against the real PyPI, through the relay's egress proxy:
//! pip fetches a small pure-Python package when the sandbox's allowlist holds the preset, and
//! fails saying it is the sandbox's egress policy, and what would allow it, when it does not.
//! A preset never carries another host, and a tenant bounded away from the registries gets
//! them by preset no more than by name. Needs root (allowlisted egress does) and PyPI
//! reachable from this machine.

use tether_e2e::Relay;

use super::{fails, member_of, ok, tether_as, text};

/// A pinned, pure-Python wheel of 11 KiB, fetched without its dependencies (it has none).
/// One retry: pip prints why a connection failed only when it retries (`--retries 0` prints
/// `No matching distribution` alone). pip reads `HTTPS_PROXY`, which points at the sandbox's
/// explicit proxy.
const PIP_DOWNLOAD: &str = "python3 -m pip download --no-deps --no-cache-dir \
                            --disable-pip-version-check --retries 1 --timeout 60 \
                            --dest /tmp/dl six==1.16.0";

#[test]
fn pip_reaches_pypi_with_the_preset_and_names_the_policy_without_it() {
    let relay = Relay::start();
    let id = relay.create(&["--allow-host", "@package-registries"]);

    // `tether info` shows what the preset stands for, never the preset.
    let info = relay.tether().args(["info", &id]).output().unwrap();
    let info = text(&info);
    for host in ["pypi.org", "files.pythonhosted.org", "registry.npmjs.org"] {
        assert!(info.contains(host), "{host} not shown: {info}");
    }
    assert!(!info.contains("@package-registries"), "{info}");

    let out = ok(&relay, &id, &format!("{PIP_DOWNLOAD} && ls /tmp/dl"));
    assert!(out.contains("six-1.16.0-py2.py3-none-any.whl"), "{out}");

    // Without the preset pip fails, and what it prints says why and what to do.
    let other = relay.create(&["--allow-host", "example.com"]);
    let said = fails(&relay, &other, PIP_DOWNLOAD);
    assert!(
        said.contains(
            "403 Forbidden by the sandbox's egress policy: pypi.org is not on its allowlist \
             (allow it with --allow-host pypi.org or the preset @package-registries)"
        ),
        "{said}"
    );
}

#[test]
fn a_preset_smuggles_no_host_and_a_tenant_bound_holds_against_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("policy.toml");
    std::fs::write(
        &config,
        "[tenants.docs-only]\negress_hosts = [\"*.example.com\"]\n",
    )
    .unwrap();
    let relay = Relay::start_with(&["--config", config.to_str().unwrap()]);

    for smuggled in [
        "@package-registries,evil.test",
        "@../x",
        "@Package-Registries",
        "@package-registries.evil.test",
    ] {
        let out = relay
            .tether()
            .args(["create", "--allow-host", smuggled])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{smuggled} was accepted");
        let said = text(&out);
        assert!(said.contains("is not a preset"), "{smuggled}: {said}");
        assert!(said.contains("@package-registries (PyPI, npm"), "{said}");
    }

    let member = member_of(&relay, "docs-only");
    let out = tether_as(
        &relay,
        &member,
        &["create", "--allow-host", "@package-registries"],
    );
    assert!(!out.status.success(), "the preset got around the bound");
    let said = text(&out);
    assert!(said.contains("pypi.org"), "{said}");
    assert!(said.contains("egress_hosts"), "{said}");
    let out = tether_as(
        &relay,
        &member,
        &["create", "--allow-host", "api.example.com"],
    );
    assert!(out.status.success(), "{}", text(&out));
}
