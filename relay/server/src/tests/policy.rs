//! What the relay lets a tenant use: strict request bodies, the policy's defaults and maxima,
//! admin-only options, host directory images, token minting by role, and secrets at rest.
use reqwest::StatusCode;
use serde_json::json;

use super::{assert_error, TestRelay};
use crate::policy::PolicyFile;
use crate::PolicyConfig;

async fn post(
    t: &TestRelay,
    path: &str,
    token: &str,
    body: serde_json::Value,
) -> (StatusCode, serde_json::Value) {
    t.call("POST", path, token, Some(body)).await
}

async fn create_image(t: &TestRelay, token: &str, image: &str) -> (StatusCode, serde_json::Value) {
    post(
        t,
        "/v1/sandboxes",
        token,
        json!({"provider": "fake", "image": image}),
    )
    .await
}

async fn mint(
    t: &TestRelay,
    by: &str,
    tenant: &str,
    admin: bool,
) -> (StatusCode, serde_json::Value) {
    post(
        t,
        "/v1/tokens",
        by,
        json!({"tenant": tenant, "admin": admin}),
    )
    .await
}

fn policy(toml: &str, image_roots: Vec<std::path::PathBuf>) -> PolicyConfig {
    PolicyConfig {
        file: PolicyFile::parse(toml, "test.toml").unwrap(),
        image_roots,
    }
}

#[tokio::test]
async fn unknown_fields_and_out_of_range_numbers_get_a_400_naming_them() {
    let t = TestRelay::start().await;
    let admin = t.admin();
    let typo = post(
        &t,
        "/v1/sandboxes",
        &admin,
        json!({"provider": "fake", "memroy_bytes": 1 << 30}),
    )
    .await;
    assert_error(
        &typo,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["unknown field `memroy_bytes`", "memory_bytes"],
    );
    let not_object = post(&t, "/v1/sandboxes", &admin, json!([1])).await;
    assert_error(
        &not_object,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["JSON object"],
    );
    for (body, words) in [
        (
            json!({"pids": 10_000_000}),
            &["`pids`", "1 and 4194304"][..],
        ),
        (json!({"pids": 0}), &["`pids`"][..]),
        (
            json!({"memory_bytes": 1u64 << 60}),
            &["`memory_bytes`", "1 PiB"][..],
        ),
        (
            json!({"memory_bytes": 10}),
            &["`memory_bytes`", "1 MiB"][..],
        ),
        (json!({"disk_bytes": 1}), &["`disk_bytes`"][..]),
        (json!({"cpus": 0.001}), &["`cpus`", "0.01 and 4096"][..]),
        (json!({"cpus": 1e9}), &["`cpus`"][..]),
        (json!({"ttl": 0}), &["`ttl`", "positive"][..]),
        (
            json!({"idle_timeout": 1e12}),
            &["`idle_timeout`", "at most"][..],
        ),
    ] {
        let mut body = body;
        body["provider"] = json!("fake");
        let got = post(&t, "/v1/sandboxes", &admin, body).await;
        assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", words);
    }
    assert_eq!(
        t.provider.creates.load(std::sync::atomic::Ordering::SeqCst),
        0
    );

    let sb = t.create(&admin, json!({"provider": "fake"})).await;
    let renew = format!("/v1/sandboxes/{}/renew", sb.id);
    let typo = t
        .call("POST", &renew, &admin, Some(json!({"ttl": 60})))
        .await;
    assert_error(
        &typo,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["unknown field `ttl`"],
    );
    let zero = t
        .call("POST", &renew, &admin, Some(json!({"ttl_secs": 0})))
        .await;
    assert_error(
        &zero,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["`ttl_secs`"],
    );
    let typo = t
        .call(
            "POST",
            "/v1/tokens",
            &admin,
            Some(json!({"tenant": "a", "admn": true})),
        )
        .await;
    assert_error(
        &typo,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["unknown field `admn`"],
    );
}

#[tokio::test]
async fn defaults_fill_what_a_request_leaves_out_and_maxima_are_named() {
    let toml = r#"
        [defaults]
        memory = "256M"
        max_memory = "1G"
        ttl = "1h"
        max_ttl = "2h"
        max_sandboxes = 2
        [tenants.big]
        max_memory = "4G"
        max_sandboxes = 3
    "#;
    let t = TestRelay::start_with_policy(policy(toml, vec![]), true).await;
    let small = t.token_for("small").await;
    let big = t.token_for("big").await;

    let sb = t.create(&small, json!({"provider": "fake"})).await;
    let spec = t.provider.last_spec.lock().unwrap().clone().unwrap();
    assert_eq!(spec.memory_bytes, Some(256 << 20));
    assert_eq!((spec.cpus, spec.pids), (Some(1.0), Some(1024)));
    assert_eq!(spec.disk_bytes, Some(10 << 30));
    assert_eq!(spec.ttl, None, "the provider keeps its own lifetime rules");
    assert_eq!(sb.expires_ms, Some(sb.created_ms + 3_600_000));
    assert!(!spec.seccomp_unconfined);

    let over = post(
        &t,
        "/v1/sandboxes",
        &small,
        json!({"provider": "fake", "memory_bytes": 2u64 << 30}),
    )
    .await;
    assert_error(
        &over,
        StatusCode::FORBIDDEN,
        "forbidden",
        &["memory 2 GiB", "small", "maximum of 1 GiB", "max_memory"],
    );
    t.create(
        &big,
        json!({"provider": "fake", "memory_bytes": 2u64 << 30}),
    )
    .await;
    let over = post(
        &t,
        "/v1/sandboxes",
        &small,
        json!({"provider": "fake", "ttl": 3 * 3600}),
    )
    .await;
    assert_error(
        &over,
        StatusCode::FORBIDDEN,
        "forbidden",
        &["ttl 3h", "max_ttl", "2h"],
    );
    let over = post(
        &t,
        "/v1/sandboxes",
        &small,
        json!({"provider": "fake", "pids": 100_000}),
    )
    .await;
    assert_error(
        &over,
        StatusCode::FORBIDDEN,
        "forbidden",
        &["max_pids", "32768"],
    );
    let renew = format!("/v1/sandboxes/{}/renew", sb.id);
    let over = t
        .call("POST", &renew, &small, Some(json!({"ttl_secs": 3 * 3600})))
        .await;
    assert_error(&over, StatusCode::FORBIDDEN, "forbidden", &["max_ttl"]);

    // The sandbox count, also under concurrent creates.
    let attempts = (0..4).map(|_| post(&t, "/v1/sandboxes", &small, json!({"provider": "fake"})));
    let results = futures_util::future::join_all(attempts).await;
    let made = results
        .iter()
        .filter(|r| r.0 == StatusCode::CREATED)
        .count();
    assert_eq!(made, 1, "{results:?}");
    let refused = results
        .iter()
        .find(|r| r.0 == StatusCode::FORBIDDEN)
        .unwrap();
    assert_error(
        refused,
        StatusCode::FORBIDDEN,
        "forbidden",
        &["max_sandboxes", "2", "tether rm"],
    );
    t.create(&big, json!({"provider": "fake"})).await;
}

#[tokio::test]
async fn the_host_network_providers_and_seccomp_follow_the_tenants_policy() {
    let toml = r#"
        [tenants.trusted]
        network_host = true
        [tenants.boxed]
        providers = []
    "#;
    let t = TestRelay::start_with_policy(policy(toml, vec![]), false).await;
    let member = t.token_for("team-a").await;
    let tenant_admin = t.mint(&t.admin(), "team-a", true).await;
    let trusted = t.token_for("trusted").await;
    let boxed = t.token_for("boxed").await;

    let host = json!({"provider": "fake", "network": "host"});
    let got = post(&t, "/v1/sandboxes", &member, host.clone()).await;
    assert_error(
        &got,
        StatusCode::FORBIDDEN,
        "forbidden",
        &["--network host", "admin", "network_host"],
    );
    t.create(&tenant_admin, host.clone()).await;
    t.create(&trusted, host).await;

    let unconfined = json!({"provider": "fake", "seccomp_unconfined": true});
    let got = post(&t, "/v1/sandboxes", &member, unconfined.clone()).await;
    assert_error(
        &got,
        StatusCode::FORBIDDEN,
        "forbidden",
        &["seccomp_unconfined", "admin"],
    );
    t.create(&tenant_admin, unconfined).await;
    assert!(
        t.provider
            .last_spec
            .lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .seccomp_unconfined
    );

    let got = post(&t, "/v1/sandboxes", &boxed, json!({"provider": "fake"})).await;
    assert_error(
        &got,
        StatusCode::FORBIDDEN,
        "forbidden",
        &["may not use provider `fake`", "providers"],
    );
    // A cloud-like provider gets no default sizes (it would refuse them); the relay still
    // bounds its lifetime.
    let cloudy = t.create(&member, json!({"provider": "fake"})).await;
    let spec = t.provider.last_spec.lock().unwrap().clone().unwrap();
    assert_eq!(
        (spec.memory_bytes, spec.cpus, spec.pids, spec.disk_bytes),
        (None, None, None, None)
    );
    assert_eq!(cloudy.expires_ms, Some(cloudy.created_ms + 24 * 3_600_000));
}

#[tokio::test]
async fn host_directory_images_are_for_admins_under_an_image_root() {
    let roots = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(roots.path()).unwrap();
    std::fs::create_dir_all(root.join("alpine/etc")).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("etc-link")).unwrap();
    let t = TestRelay::start_with_policy(policy("", vec![root.clone()]), true).await;
    let admin = t.admin();
    let member = t.token_for("team-a").await;

    let data = t.dir.path().join("data");
    std::fs::create_dir_all(data.join("local/sb-other/workspace")).unwrap();
    let alpine = root.join("alpine");
    for image in ["/etc", data.to_str().unwrap(), alpine.to_str().unwrap()] {
        let got = create_image(&t, &member, image).await;
        assert_error(
            &got,
            StatusCode::FORBIDDEN,
            "forbidden",
            &["only admin tokens", "oci:"],
        );
    }
    // oci: images are everyone's, but not from the data directory, where tenants write.
    t.create(
        &member,
        json!({"provider": "fake", "image": "oci:/srv/layout"}),
    )
    .await;
    let planted = format!(
        "oci:{}:latest",
        data.join("local/sb-other/workspace").display()
    );
    let got = create_image(&t, &member, &planted).await;
    assert_error(
        &got,
        StatusCode::FORBIDDEN,
        "forbidden",
        &["data directory"],
    );

    let via_dots = format!("{}/alpine/etc/..", root.display());
    t.create(&admin, json!({"provider": "fake", "image": via_dots}))
        .await;
    let spec = t.provider.last_spec.lock().unwrap().clone().unwrap();
    assert_eq!(
        spec.image.as_deref(),
        alpine.to_str(),
        "the provider gets the resolved path"
    );

    let (link, workspace) = (root.join("etc-link"), data.join("local/sb-other/workspace"));
    for (image, words) in [
        ("/etc", &["not under an image root"][..]),
        (link.to_str().unwrap(), &["resolved: /etc"][..]),
        (data.to_str().unwrap(), &["data directory"][..]),
        (workspace.to_str().unwrap(), &["data directory"][..]),
        ("/", &["data directory"][..]),
    ] {
        let got = create_image(&t, &admin, image).await;
        assert_error(&got, StatusCode::FORBIDDEN, "forbidden", words);
    }
    let got = create_image(&t, &admin, "/nonexistent/dir").await;
    assert_error(
        &got,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["cannot be used"],
    );
}

#[tokio::test]
async fn only_the_relay_admin_mints_for_other_tenants_or_mints_admins() {
    let t = TestRelay::start().await;
    let a_admin = t.mint(&t.admin(), "team-a", true).await;
    let a_member = t.mint(&a_admin, "team-a", false).await;
    let got = mint(&t, &a_admin, "team-b", false).await;
    assert_error(
        &got,
        StatusCode::FORBIDDEN,
        "forbidden",
        &["team-a", "not for team-b", "admin.token"],
    );
    let got = mint(&t, &a_admin, "default", false).await;
    assert_eq!(got.0, StatusCode::FORBIDDEN, "{}", got.1);
    let got = mint(&t, &a_admin, "team-a", true).await;
    assert_error(
        &got,
        StatusCode::FORBIDDEN,
        "forbidden",
        &["only the relay's own admin token"],
    );
    let got = mint(&t, &a_member, "team-a", false).await;
    assert_error(
        &got,
        StatusCode::FORBIDDEN,
        "forbidden",
        &["only admin tokens"],
    );

    // The member token works, for its tenant.
    t.create(&a_member, json!({"provider": "fake"})).await;
    let listed = t.call("GET", "/v1/sandboxes", &a_admin, None).await;
    assert_eq!(listed.1.as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn the_database_holds_no_token_in_plain_text() {
    let mut t = TestRelay::start().await;
    let admin = t.admin();
    let member = t.token_for("team-a").await;
    let a = t.create(&member, json!({"provider": "fake"})).await;
    let env = json!({"provider": "fake", "env": {"API_KEY": "env-secret-value"}});
    t.create(&admin, env).await;
    // Both agent tokens, the deleted sandbox's too: deleted rows are zeroed.
    let agent_tokens = t.provider.agent_tokens();
    assert_eq!(agent_tokens.len(), 2);
    let delete = t
        .call("DELETE", &format!("/v1/sandboxes/{}", a.id), &member, None)
        .await;
    assert_eq!(delete.0, StatusCode::NO_CONTENT);
    let db_bytes = |t: &TestRelay| {
        let mut all = Vec::new();
        for file in ["relay.db", "relay.db-wal"] {
            if let Ok(bytes) = std::fs::read(t.dir.path().join("data").join(file)) {
                all.extend(bytes);
            }
        }
        all
    };
    let contains =
        |hay: &[u8], needle: &str| hay.windows(needle.len()).any(|w| w == needle.as_bytes());
    let bytes = db_bytes(&t);
    assert!(bytes.len() > 4096, "the database was read");
    let env_secret = "env-secret-value".to_string();
    for secret in [
        &admin,
        &member,
        &agent_tokens[0],
        &agent_tokens[1],
        &env_secret,
    ] {
        assert!(!contains(&bytes, secret), "relay.db holds {secret}");
    }

    // After a restart the sealed token still reaches the agent.
    t.restart().await;
    let admin_sb = t.call("GET", "/v1/sandboxes", &admin, None).await.1[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(t.tunnel(&admin_sb, &admin).await.is_ok());
    let key = std::fs::metadata(t.dir.path().join("data/relay.key")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(key.permissions().mode() & 0o777, 0o600);
}

#[tokio::test]
async fn members_allow_only_public_networks_and_those_their_policy_names() {
    let toml = r#"
        [tenants.lab]
        egress_networks = ["10.20.0.0/16", "169.254.169.254/32"]
    "#;
    let t = TestRelay::start_with_policy(policy(toml, vec![]), false).await;
    let member = t.token_for("team-a").await;
    let lab = t.token_for("lab").await;
    let admin = t.admin();
    let allowing = |cidr: &str| json!({"provider": "fake", "network": "allowlist", "egress": {"allow_cidrs": [cidr]}});
    // The issue's attack (`0.0.0.0` is the host's loopback), and every loopback form: no
    // token and no policy allows them.
    for cidr in [
        "0.0.0.0/32",
        "127.0.0.2/32",
        "::ffff:127.0.0.1/128",
        "0.0.0.0/8",
    ] {
        for token in [&member, &lab, &admin] {
            let got = post(&t, "/v1/sandboxes", token, allowing(cidr)).await;
            assert_error(
                &got,
                StatusCode::FORBIDDEN,
                "forbidden",
                &[cidr, "nothing can allow it"],
            );
        }
    }
    // Link-local (cloud metadata), private ranges and everything at once: not a member's to
    // allow unless its policy names them.
    for cidr in [
        "169.254.169.254/32",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "0.0.0.0/0",
    ] {
        let got = post(&t, "/v1/sandboxes", &member, allowing(cidr)).await;
        assert_error(
            &got,
            StatusCode::FORBIDDEN,
            "forbidden",
            &[cidr, "public addresses only", "egress_networks"],
        );
    }
    let got = post(&t, "/v1/sandboxes", &lab, allowing("10.21.0.0/16")).await;
    assert_error(
        &got,
        StatusCode::FORBIDDEN,
        "forbidden",
        &["10.21.0.0/16", "10.20.0.0/16, 169.254.169.254/32"],
    );
    t.create(&lab, allowing("10.20.3.0/24")).await;
    t.create(&lab, allowing("169.254.169.254/32")).await;
    // Public, and no address of this host (whose test machines use 192.0.2.0/24).
    t.create(&member, allowing("198.51.100.0/24")).await;
    t.create(&admin, allowing("10.0.0.0/8")).await;
}

#[tokio::test]
async fn a_preset_is_its_hosts_before_the_policy_looks_and_after() {
    let toml = r#"
        [tenants.docs-only]
        egress_hosts = ["*.example.com"]
        [tenants.registries]
        egress_hosts = ["@package-registries"]
    "#;
    let t = TestRelay::start_with_policy(policy(toml, vec![]), false).await;
    let member = t.token_for("team-a").await;
    let docs_only = t.token_for("docs-only").await;
    let registries = t.token_for("registries").await;
    let admin = t.admin();
    let allowing = |hosts: &[&str]| json!({"provider": "fake", "network": "allowlist", "egress": {"allow_hosts": hosts}});

    // The provider and `tether info` see the preset's hosts, never the preset.
    let made = t
        .create(
            &member,
            allowing(&["@package-registries", "api.example.com"]),
        )
        .await;
    let spec = t.provider.last_spec.lock().unwrap().clone().unwrap();
    let hosts = &spec.egress.allow_hosts;
    assert!(hosts.iter().all(|h| !h.contains('@')), "{hosts:?}");
    for name in ["pypi.org", "files.pythonhosted.org", "registry.npmjs.org"] {
        assert!(hosts.iter().any(|h| h == name), "{name}: {hosts:?}");
    }
    let (_, info) = t
        .call("GET", &format!("/v1/sandboxes/{}", made.id), &member, None)
        .await;
    let shown = info["network"]["egress"]["allow_hosts"].to_string();
    assert!(
        shown.contains("deb.debian.org") && !shown.contains('@'),
        "{shown}"
    );

    // Nothing rides along with a preset's name, and no near miss is guessed at.
    for smuggled in [
        "@package-registries,evil.com",
        "@../x",
        "@Package-Registries",
        "@registries",
    ] {
        let got = post(&t, "/v1/sandboxes", &member, allowing(&[smuggled])).await;
        assert_error(
            &got,
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            &[smuggled, "@package-registries (PyPI, npm"],
        );
    }
    // Presets are for allowed hosts, not a secret's.
    let secret = json!({"provider": "fake", "network": "allowlist",
        "secrets": [{"name": "K", "hosts": ["@package-registries"], "value": "v"}]});
    let got = post(&t, "/v1/sandboxes", &member, secret).await;
    assert_error(
        &got,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["preset"],
    );

    // A tenant bounded away from the registries gets them neither by name nor by preset.
    for hosts in [&["@package-registries"][..], &["pypi.org"][..]] {
        let got = post(&t, "/v1/sandboxes", &docs_only, allowing(hosts)).await;
        assert_error(
            &got,
            StatusCode::FORBIDDEN,
            "forbidden",
            &["pypi.org", "*.example.com", "egress_hosts"],
        );
    }
    t.create(
        &docs_only,
        allowing(&["api.example.com", "*.eu.example.com"]),
    )
    .await;
    let got = post(&t, "/v1/sandboxes", &docs_only, allowing(&["example.com"])).await;
    assert_error(&got, StatusCode::FORBIDDEN, "forbidden", &["example.com"]);
    // One bounded to the preset gets it, and nothing beside it; admins are not bounded.
    t.create(&registries, allowing(&["@package-registries"]))
        .await;
    t.create(&registries, allowing(&["pypi.org"])).await;
    let got = post(&t, "/v1/sandboxes", &registries, allowing(&["*.pypi.org"])).await;
    assert_error(&got, StatusCode::FORBIDDEN, "forbidden", &["*.pypi.org"]);
    t.create(&admin, allowing(&["@package-registries", "evil.test"]))
        .await;
}
