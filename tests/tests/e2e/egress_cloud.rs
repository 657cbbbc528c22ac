//! Secrets on cloud sandboxes, end to end: a real relay with an egress listener
//! (`--egress-url`), the E2B, Daytona and Modal fakes, and an HTTPS upstream in a network
//! namespace the test makes (`egress::Upstream`), which echoes the headers it receives. The
//! fakes' sandboxes are real local sandboxes of an OCI image built and pushed to a real
//! registry here (busybox, curl and its libraries, the static agent), and reach the relay's
//! egress listener at their own 127.0.0.1 and nothing else (`tether-fake --sandbox-reach`), as
//! a cloud sandbox whose provider allows the relay's address would.
//!
//! For each provider: the upstream receives the real value; inside, the value is nowhere (any
//! process's environment or command line, any file, the CA key); a request without the
//! proxy credential, with a wrong one, or with another sandbox's id is refused (407); a host
//! off the allowlist is refused (403); one sandbox's credential never puts in another's
//! secrets; a restarted relay serves the sandbox again; a deleted sandbox's credential is
//! revoked; nothing of the value reaches the relay's log; `tether info` says what holds.
//! Without `--egress-url`, a cloud create with a secret is refused naming the flag. With an
//! `https` egress URL (E2B's fake), the listener serves TLS with the relay's certificate,
//! signed by a private CA that the sandbox is given, and the secret still reaches its host.
//!
//! Needs root (namespaces), and the Debian packages docker-registry and busybox-static, curl
//! on this host (copied into the image), and the static agent.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use tether_e2e::cloud::{free_port, listed, tether, Fake};
use tether_e2e::images::{build, busybox_rootfs, image_cmd, run_ok, static_agent, RegistryServer};
use tether_e2e::{bin, Relay};

use crate::egress::{fails, ok, text, trust_upstream, Upstream};

/// Busybox applets the tests' scripts use, besides those `busybox_rootfs` links.
const APPLETS: [&str; 15] = [
    "grep", "find", "xargs", "env", "printf", "tr", "head", "sed", "mkdir", "rm", "sleep", "test",
    "cut", "wc", "ps",
];
/// Values nothing else contains: finding one anywhere means it leaked.
const VALUE_A: &str = "sk-cloud-a-4Fq8Zp2Lx7Rm1Wc9";
const VALUE_B: &str = "sk-cloud-b-8Jd3Ks6Nv0Ty5Hb2";

/// One fake provider, and how the relay and `tether image build` reach it.
struct Cloud {
    /// The provider's name for `--provider` and `--target`.
    name: &'static str,
    fake: Fake,
}

impl Cloud {
    /// The fake `name`, its sandboxes reaching `reach` on this host.
    fn start(name: &'static str, reach: &str) -> Cloud {
        let args: Vec<&str> = match name {
            "e2b" => vec!["--api-key", "e2b_fake_key"],
            "daytona" => vec!["--api-key", "dtn_fake_key"],
            _ => vec!["--token-id", "ak-fake", "--token-secret", "as-fake"],
        };
        let mut all = args;
        all.extend(["--sandbox-reach", reach]);
        Cloud {
            name,
            fake: Fake::start(name, &all),
        }
    }

    /// The provider's settings: variable name and value.
    fn settings(&self) -> Vec<(&'static str, String)> {
        let url = self.fake.url.clone();
        match self.name {
            "e2b" => vec![
                ("E2B_API_KEY", "e2b_fake_key".into()),
                ("E2B_API_URL", url.clone()),
                ("E2B_SANDBOX_URL", url),
            ],
            "daytona" => vec![
                ("DAYTONA_API_KEY", "dtn_fake_key".into()),
                ("DAYTONA_API_URL", format!("{url}/api")),
            ],
            _ => vec![
                ("MODAL_TOKEN_ID", "ak-fake".into()),
                ("MODAL_TOKEN_SECRET", "as-fake".into()),
                ("MODAL_SERVER_URL", url),
            ],
        }
    }

    /// The settings as the relay's `config.toml`.
    fn config_toml(&self) -> String {
        let mut toml = format!("[{}]\n", self.name);
        for (var, value) in self.settings() {
            let key = var.split_once('_').map(|(_, k)| k).unwrap_or(var);
            toml.push_str(&format!("{} = \"{value}\"\n", key.to_ascii_lowercase()));
        }
        toml
    }

    /// Builds `base` (a registry reference) into an image of this provider named `name`.
    fn build(&self, base: &str, name: &str) {
        let home = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(bin("tether"));
        cmd.args(["image", "build", "--target", self.name, "--name", name])
            .args(["--from", base, "--agent"])
            .arg(static_agent())
            .env("TETHER_HOME", home.path())
            .env_remove("SOURCE_DATE_EPOCH");
        for (key, _) in std::env::vars() {
            if ["E2B_", "DAYTONA_", "MODAL_"]
                .iter()
                .any(|p| key.starts_with(p))
            {
                cmd.env_remove(key);
            }
        }
        cmd.envs(self.settings());
        run_ok(&mut cmd);
    }
}

/// A root file system with busybox, curl and every library it loads, and this host's CA
/// bundle at Debian's path (which the relay replaces with one that holds the sandbox's CA).
pub(crate) fn curl_rootfs(dir: &Path) -> PathBuf {
    let root = busybox_rootfs(dir);
    for applet in APPLETS {
        let link = root.join("bin").join(applet);
        if !link.exists() {
            std::os::unix::fs::symlink("busybox", link).unwrap();
        }
    }
    let ldd = run_ok(Command::new("ldd").arg("/usr/bin/curl"));
    let libs = ldd
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')))
        .map(PathBuf::from);
    for file in libs.chain([PathBuf::from("/usr/bin/curl")]) {
        let dst = root.join(file.strip_prefix("/").unwrap());
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(&file, &dst).unwrap_or_else(|e| panic!("copy {}: {e}", file.display()));
    }
    let certs = root.join("etc/ssl/certs");
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::copy(
        "/etc/ssl/certs/ca-certificates.crt",
        certs.join("ca-certificates.crt"),
    )
    .unwrap();
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    std::fs::create_dir_all(root.join("root")).unwrap();
    root
}

/// Builds the curl root with the agent, pushes it to `registry`; returns its reference.
fn push_curl_image(registry: &RegistryServer) -> String {
    let dir = tempfile::tempdir().unwrap();
    let root = curl_rootfs(dir.path());
    let layout = dir.path().join("image");
    build(&root, &layout, &[]);
    let reference = format!("{}/curl-base:v1", registry.addr);
    let out = image_cmd(&["push", layout.to_str().unwrap(), &reference]);
    assert!(out.status.success(), "push: {}", text(&out));
    reference
}

/// `tether create --provider P --image IMAGE --secret NAME@api.allowed.test EXTRA...` with
/// the value in the caller's environment; the new sandbox's id.
fn create_with_secret(
    relay: &Relay,
    cloud: &Cloud,
    image: &str,
    (name, value): (&str, &str),
    extra: &[&str],
) -> String {
    let secret = format!("{name}@api.allowed.test");
    let out = relay
        .tether()
        .env(name, value)
        .args(["create", "--provider", cloud.name, "--image", image])
        .args(["--secret", &secret])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The sandbox's proxy URL, from its environment.
fn proxy_url(relay: &Relay, id: &str) -> String {
    ok(relay, id, "printf '%s' \"$HTTPS_PROXY\"")
}

/// `http://USER:PASSWORD@ADDR` split into user and password.
fn credentials(proxy: &str) -> (String, String) {
    let userinfo = proxy
        .strip_prefix("http://")
        .and_then(|rest| rest.split_once('@'))
        .map(|(u, _)| u)
        .unwrap_or_else(|| panic!("no credentials in {proxy}"));
    let (user, password) = userinfo.split_once(':').unwrap();
    (user.to_string(), password.to_string())
}

/// Asserts `value` is nowhere inside sandbox `id`: no process's environment or command line,
/// no file outside /proc, /sys and /dev; and no private key where files are written (the
/// libraries' own PEM markers aside).
fn nowhere_inside(relay: &Relay, id: &str, value: &str) {
    // The pattern ends in a bracket expression, so the searching commands' own command lines
    // do not match it.
    let (head, last) = value.split_at(value.len() - 1);
    let pattern = format!("{head}[{last}]");
    fails(
        relay,
        id,
        &format!("cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | grep -q '{pattern}'"),
    );
    let found = relay.sh(
        id,
        &format!(
            "find / \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -type f -print \
             2>/dev/null | xargs grep -ls -e '{pattern}'; \
             grep -rls 'PRIVATE [K]EY' /etc /tmp /root /workspace"
        ),
    );
    assert_eq!(
        String::from_utf8_lossy(&found.stdout),
        "",
        "found inside {id}"
    );
}

/// Everything the module docs promise, on provider `name`.
fn secrets_reach_their_host_through_the_relay(name: &'static str) {
    let upstream = Upstream::start();
    let registry = RegistryServer::start();
    let base = push_curl_image(&registry);
    let port = free_port();
    let reach = format!("127.0.0.1:{port}");
    let cloud = Cloud::start(name, &reach);
    let image = format!("tether-curl-{name}");
    cloud.build(&base, &image);

    let hosts = upstream.hosts_file();
    let ca = upstream.dir.path().join("ca.pem");
    let log = upstream.dir.path().join("relay.log");
    // Daytona holds either names or networks, and the secret's host is a name, so there the
    // relay is named too: curl resolves `*.localhost` to loopback by itself.
    let egress_url = match name {
        "daytona" => format!("http://relay.localhost:{port}"),
        _ => format!("http://{reach}"),
    };
    let log_file = std::fs::File::create(&log).unwrap();
    let mut relay = Relay::start_with_settings(
        &cloud.config_toml(),
        &[
            "--egress-hosts",
            hosts.to_str().unwrap(),
            "--egress-ca-file",
            ca.to_str().unwrap(),
            "--egress-url",
            &egress_url,
            "--egress-listen",
            &reach,
        ],
        |cmd| {
            cmd.env("TETHER_LOG", "debug")
                .env("RUST_LOG", "debug")
                .stderr(log_file);
        },
    );

    let a = create_with_secret(
        &relay,
        &cloud,
        &image,
        ("KEY_A", VALUE_A),
        &["--allow-host", "pypi.allowed.test"],
    );
    trust_upstream(&relay, &a, &upstream);
    let placeholder_a = ok(&relay, &a, "printf '%s' \"$KEY_A\"");
    assert!(
        placeholder_a.starts_with("tether-secret-"),
        "{placeholder_a}"
    );

    // The secret's host receives the value: the request went through the relay's proxy (the
    // sandbox's HTTPS_PROXY), and the sandbox trusts its CA (installed through its agent).
    let echoed = ok(
        &relay,
        &a,
        "curl -sSf -H \"Authorization: Bearer $KEY_A\" https://api.allowed.test/echo",
    );
    assert!(echoed.contains(&format!("Bearer {VALUE_A}")), "{echoed}");
    assert!(
        !echoed.to_ascii_lowercase().contains("proxy-authorization"),
        "{echoed}"
    );
    let bundle = ok(&relay, &a, "cat /etc/ssl/certs/ca-certificates.crt");
    let ca_pem = ok(&relay, &a, "cat /etc/tether/egress-ca.pem");
    assert!(ca_pem.contains("BEGIN CERTIFICATE") && bundle.contains(ca_pem.trim()));

    // Another allowed host gets the placeholder, untouched and not intercepted.
    let elsewhere = ok(
        &relay,
        &a,
        "curl -sSf --cacert /tmp/upstream-ca.pem -H \"Authorization: Bearer $KEY_A\" \
         https://pypi.allowed.test/echo",
    );
    assert!(
        elsewhere.contains(&format!("Bearer {placeholder_a}")),
        "{elsewhere}"
    );

    // Refused: a host off the allowlist (403), no credential or a wrong one (407), and a
    // request that ignores the proxy (nothing but the relay is reachable here).
    let denied = fails(&relay, &a, "curl -sS https://denied.test/");
    assert!(denied.contains("403"), "{denied}");
    let (id_a, cred_a) = credentials(&proxy_url(&relay, &a));
    assert_eq!(id_a, a);
    let missing = fails(
        &relay,
        &a,
        &format!("curl -sS -x http://{reach} https://api.allowed.test/echo"),
    );
    assert!(missing.contains("407"), "{missing}");
    let wrong = fails(
        &relay,
        &a,
        &format!(
            "curl -sS -x http://{a}:{}@{reach} https://api.allowed.test/echo",
            "0".repeat(32)
        ),
    );
    assert!(wrong.contains("407"), "{wrong}");
    fails(
        &relay,
        &a,
        "curl -sS --max-time 10 --noproxy '*' https://api.allowed.test/echo",
    );

    // A second sandbox: its credential never puts in the first's secret, and neither
    // credential works under the other's id.
    let b = create_with_secret(&relay, &cloud, &image, ("KEY_B", VALUE_B), &[]);
    let (_, cred_b) = credentials(&proxy_url(&relay, &b));
    let cross = ok(
        &relay,
        &b,
        &format!(
            "curl -sSf -H 'Authorization: Bearer {placeholder_a}' https://api.allowed.test/echo"
        ),
    );
    assert!(
        cross.contains(&placeholder_a) && !cross.contains(VALUE_A),
        "{cross}"
    );
    for (user, password) in [(&a, &cred_b), (&b, &cred_a)] {
        let swapped = fails(
            &relay,
            &b,
            &format!("curl -sS -x http://{user}:{password}@{reach} https://api.allowed.test/echo"),
        );
        assert!(swapped.contains("407"), "{swapped}");
    }

    // Inside, neither value is anywhere, nor any CA key.
    for (id, value) in [(&a, VALUE_A), (&b, VALUE_B)] {
        nowhere_inside(&relay, id, value);
    }

    // `tether info` says who enforces what, and what goes around the relay.
    let network = &listed(&relay, &a)["network"];
    assert_eq!(network["enforced_by"], name, "{network}");
    assert_eq!(network["secrets"][0]["name"], "KEY_A", "{network}");
    let said = |field: &str, words: &str| {
        network[field]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g.as_str().unwrap().contains(words))
    };
    assert!(said("guarantees", "relay's egress proxy"), "{network}");
    assert!(said("not_guaranteed", "goes direct"), "{network}");
    assert!(
        said("not_guaranteed", "not narrowed to the relay"),
        "{network}"
    );
    let shown = serde_json::to_string(&listed(&relay, &a)).unwrap();
    assert!(
        !shown.contains(VALUE_A) && !shown.contains(&cred_a),
        "{shown}"
    );

    // Nothing of either value reached the relay's log, debug lines included.
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("egress"),
        "the relay logged nothing of egress"
    );
    for value in [VALUE_A, VALUE_B] {
        assert!(!logged.contains(value), "the relay logged a secret value");
    }
    assert!(
        !logged.contains(&cred_a),
        "the relay logged a proxy credential"
    );

    // A restarted relay serves the sandbox again, with the same credential.
    relay.restart();
    let again = ok(
        &relay,
        &a,
        "curl -sSf -H \"Authorization: Bearer $KEY_A\" https://api.allowed.test/echo",
    );
    assert!(again.contains(&format!("Bearer {VALUE_A}")), "{again}");

    // Whoever holds a sandbox's credential can use the proxy as that sandbox, until the
    // sandbox is deleted: then it is refused. (It is served with certificates of that
    // sandbox's CA, which the holder need not trust to send the request: `-k`.)
    let stolen = format!(
        "curl -sS -k -x http://{a}:{cred_a}@{reach} -H 'Authorization: Bearer {placeholder_a}' \
         https://api.allowed.test/echo"
    );
    let used = ok(&relay, &b, &stolen);
    assert!(used.contains(VALUE_A), "{used}");
    tether(&relay, &["rm", &a]);
    let revoked = fails(&relay, &b, &stolen);
    assert!(revoked.contains("407"), "{revoked}");
}

#[test]
fn e2b_secrets_reach_their_host_through_the_relay() {
    secrets_reach_their_host_through_the_relay("e2b");
}

#[test]
fn daytona_secrets_reach_their_host_through_the_relay() {
    secrets_reach_their_host_through_the_relay("daytona");
}

#[test]
fn modal_secrets_reach_their_host_through_the_relay() {
    secrets_reach_their_host_through_the_relay("modal");
}

#[test]
fn cloud_secrets_without_an_egress_url_are_refused_naming_the_flag() {
    let cloud = Cloud::start("e2b", "127.0.0.1:9");
    let relay = Relay::start_with_settings(&cloud.config_toml(), &[], |_| {});
    let out = relay
        .tether()
        .env("KEY", VALUE_A)
        .args(["create", "--provider", "e2b", "--image", "any-template"])
        .args(["--secret", "KEY@api.allowed.test"])
        .output()
        .unwrap();
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("--egress-url"), "{said}");
    assert!(said.contains("KEY") && !said.contains(VALUE_A), "{said}");
    // Nothing was created at the provider.
    let (code, body) = tether_e2e::cloud::http(
        &cloud.fake.url,
        "GET",
        "/v2/sandboxes",
        &[("X-API-Key", "e2b_fake_key")],
        "",
    );
    assert_eq!(code, 200, "{body}");
    let listed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{body}");

    // An egress URL a provider cannot allow is refused at create, naming what to give.
    let relay = Relay::start_with_settings(
        &cloud.config_toml(),
        &[
            "--egress-url",
            "http://relay.example.com:3129",
            "--egress-listen",
            "127.0.0.1:0",
        ],
        |_| {},
    );
    let out = relay
        .tether()
        .env("KEY", VALUE_A)
        .args(["create", "--provider", "e2b", "--image", "any-template"])
        .args(["--secret", "KEY@api.allowed.test"])
        .output()
        .unwrap();
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("port 443") && said.contains("--egress-url"),
        "{said}"
    );
    // So is a proxy variable of the caller's own, which would take the route away.
    let out = relay
        .tether()
        .env("KEY", VALUE_A)
        .args(["create", "--provider", "e2b", "--image", "any-template"])
        .args([
            "--secret",
            "KEY@api.allowed.test",
            "--env",
            "https_proxy=http://mine:8080",
        ])
        .output()
        .unwrap();
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("drop --env https_proxy"), "{said}");
}

/// A private CA and a relay certificate it signed for 127.0.0.1 and localhost, as files in
/// `dir`: the chain (leaf, then the CA, as an operator with a private CA writes it), the key,
/// and the CA alone (PEM text too).
fn relay_certificate(dir: &Path) -> (PathBuf, PathBuf, PathBuf, String) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "relay's private CA");
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let issuer =
        rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let (chain, key_path, ca) = (
        dir.join("relay.crt"),
        dir.join("relay.key"),
        dir.join("ca.pem"),
    );
    std::fs::write(&chain, format!("{}{}", leaf.pem(), issuer.pem())).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    std::fs::write(&ca, issuer.pem()).unwrap();
    (chain, key_path, ca, issuer.pem())
}

#[test]
fn e2b_secrets_reach_their_host_through_a_tls_egress_listener() {
    let upstream = Upstream::start();
    let registry = RegistryServer::start();
    let base = push_curl_image(&registry);
    let port = free_port();
    let reach = format!("127.0.0.1:{port}");
    let cloud = Cloud::start("e2b", &reach);
    let image = "tether-curl-e2b-tls";
    cloud.build(&base, image);

    let pki = tempfile::tempdir().unwrap();
    let (cert, key, ca, ca_pem) = relay_certificate(pki.path());
    let hosts = upstream.hosts_file();
    let upstream_ca = upstream.dir.path().join("ca.pem");
    let egress_url = format!("https://{reach}");
    let relay = Relay::start_with_settings(
        &cloud.config_toml(),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--egress-hosts",
            hosts.to_str().unwrap(),
            "--egress-ca-file",
            upstream_ca.to_str().unwrap(),
            "--egress-url",
            &egress_url,
            "--egress-listen",
            &reach,
        ],
        |_| {},
    )
    .trusting(&ca);

    let id = create_with_secret(&relay, &cloud, image, ("KEY_A", VALUE_A), &[]);
    let proxy = proxy_url(&relay, &id);
    assert!(
        proxy.starts_with(&format!("https://{id}:")) && proxy.ends_with(&reach),
        "{proxy}"
    );
    // The sandbox trusts the listener by the relay's CA, installed with its own.
    let bundle = ok(&relay, &id, "cat /etc/ssl/certs/ca-certificates.crt");
    assert!(
        bundle.contains(ca_pem.trim()),
        "the relay's CA is not trusted"
    );

    // Through the TLS listener, the secret's host receives the value.
    let echoed = ok(
        &relay,
        &id,
        "curl -sSf -H \"Authorization: Bearer $KEY_A\" https://api.allowed.test/echo",
    );
    assert!(echoed.contains(&format!("Bearer {VALUE_A}")), "{echoed}");
    // And over TLS as over plain HTTP, a request without the credential is refused.
    let missing = fails(
        &relay,
        &id,
        &format!("curl -sS -x https://{reach} https://api.allowed.test/echo"),
    );
    assert!(missing.contains("407"), "{missing}");
    // Plain HTTP on the TLS listener gets nowhere.
    let plain = fails(
        &relay,
        &id,
        &format!("curl -sS --max-time 10 -x http://{reach} https://api.allowed.test/echo"),
    );
    assert!(!plain.contains(VALUE_A), "{plain}");
    nowhere_inside(&relay, &id, VALUE_A);
}
