//! Allowlisted egress of local sandboxes (`--allow-host`, `--allow-cidr`), against upstream
//! servers the test runs in a network namespace of its own (a veth pair to the host, a private
//! /30), which the relay reaches through `--egress-hosts`. Needs root, as allowlisted egress
//! does.
//!
//! Allowed names work over HTTP and HTTPS and through pip; everything else is refused (HTTP
//! with a 403 that says why, HTTPS by name or by a forged server name, raw TCP and UDP to the
//! upstream's address, DNS lookups); a DNS-tunnel lookup never leaves (the upstream's UDP 53
//! sees nothing); nothing inside can undo the rules; a CIDR allowance reaches its network, over
//! TCP and UDP (replies from the address sent to; port 53 and other addresses refused); a
//! flood of UDP flows stops at the cap and leaves no socket behind; a restarted relay keeps
//! serving the sandbox.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tether_e2e::Relay;

mod registries;

/// The upstream's servers (see the script's docstring).
const UPSTREAM_PY: &str = include_str!("support/upstream.py");
/// Names the upstream answers for, in the relay's hosts file.
const NAMES: [&str; 5] = [
    "api.allowed.test",
    "pypi.allowed.test",
    "api.allowed-parent.test",
    "denied.test",
    "secretdata.allowed-parent.test",
];
/// How long the upstream may take to start, and a datagram to arrive.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The pause between two looks at the upstream's record file.
const POLL: Duration = Duration::from_millis(20);
/// The port of the UDP echo server [`Upstream::udp_echo`] runs.
const ECHO_PORT: u16 = 7777;
/// UDP flows the relay allows one sandbox (the relay's `MAX_UDP_FLOWS`).
const MAX_UDP_FLOWS: usize = 256;

/// Upstream namespaces made by this process, so parallel tests get different ones.
static UPSTREAMS: AtomicU32 = AtomicU32::new(0);

/// A network namespace with the upstream servers, removed on drop.
pub(crate) struct Upstream {
    ns: String,
    /// The upstream's address.
    pub(crate) addr: Ipv4Addr,
    child: Child,
    pub(crate) dir: tempfile::TempDir,
    /// The CA that signed the HTTPS server's certificate (PEM).
    pub(crate) ca_pem: String,
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Upstream {
    pub(crate) fn start() -> Upstream {
        let n = (std::process::id() * 31 + UPSTREAMS.fetch_add(1, Ordering::SeqCst)) % 16_384;
        let base = u32::from(Ipv4Addr::new(10, 128, 0, 0)) + n * 4;
        let (host, addr) = (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2));
        let (ns, outer, inner) = (
            format!("tether-eg{n}"),
            format!("teg{n}h"),
            format!("teg{n}u"),
        );
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        run("ip", &["netns", "add", &ns]);
        run(
            "ip",
            &[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ],
        );
        run("ip", &["link", "set", &inner, "netns", &ns]);
        run("ip", &["addr", "add", &format!("{host}/30"), "dev", &outer]);
        run("ip", &["link", "set", &outer, "up"]);
        run(
            "ip",
            &[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/30"),
                "dev",
                &inner,
            ],
        );
        run("ip", &["-n", &ns, "link", "set", &inner, "up"]);
        run("ip", &["-n", &ns, "link", "set", "lo", "up"]);

        let dir = tempfile::tempdir().unwrap();
        let www = dir.path().join("www");
        std::fs::create_dir_all(&www).unwrap();
        std::fs::write(www.join("index.html"), "hello from upstream\n").unwrap();
        make_index(&www);
        let ca_pem = make_certificates(dir.path());
        let script = dir.path().join("upstream.py");
        std::fs::write(&script, UPSTREAM_PY).unwrap();
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &ns, "/usr/bin/python3"])
            .arg(&script)
            .arg(&www)
            .arg(dir.path().join("cert.pem"))
            .arg(dir.path().join("key.pem"))
            .arg(dir.path().join("record"));
        let child = started(command, "the upstream did not start");
        Upstream {
            ns,
            addr,
            child,
            dir,
            ca_pem,
        }
    }

    /// A hosts(5) file naming the upstream for every test name.
    pub(crate) fn hosts_file(&self) -> PathBuf {
        let path = self.dir.path().join("hosts");
        std::fs::write(&path, format!("{} {}\n", self.addr, NAMES.join(" "))).unwrap();
        path
    }

    /// The datagrams the upstream received besides a control one the host sends now: once
    /// the control datagram is recorded, anything a sandbox sent before it would be too.
    fn datagrams_from_sandboxes(&self) -> Vec<String> {
        let control = format!("control-{}", std::process::id());
        let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
        sock.send_to(control.as_bytes(), (self.addr, 9999)).unwrap();
        let record = self.dir.path().join("record");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let text = std::fs::read_to_string(&record).unwrap_or_default();
            if text.contains(&control) {
                return text
                    .lines()
                    .filter(|l| !l.contains(&control))
                    .map(str::to_string)
                    .collect();
            }
            assert!(
                Instant::now() < deadline,
                "the control datagram never arrived"
            );
            std::thread::sleep(POLL);
        }
    }
}

/// A process the test started, killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Upstream {
    /// A UDP server on every address of the upstream's namespace, port [`ECHO_PORT`], that
    /// answers each datagram with `echo:` and the datagram.
    fn udp_echo(&self) -> Killed {
        let script = format!(
            "import socket\n\
             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
             s.bind(('0.0.0.0', {ECHO_PORT}))\n\
             print('ready', flush=True)\n\
             while True:\n    \
                 data, peer = s.recvfrom(65536)\n    \
                 s.sendto(b'echo:' + data, peer)\n"
        );
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.ns, "/usr/bin/python3", "-c", &script]);
        let child = started(command, "the UDP echo server did not start");
        Killed(child)
    }

    /// Waits until the upstream has recorded a datagram holding `text`.
    fn wait_for_datagram(&self, text: &str) {
        let record = self.dir.path().join("record");
        let deadline = Instant::now() + READY_TIMEOUT;
        while !std::fs::read_to_string(&record)
            .unwrap_or_default()
            .contains(text)
        {
            assert!(Instant::now() < deadline, "{text} never arrived");
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// A PEP 503 index under `www/simple` with one small wheel, `tinypkg`.
/// Spawns `command` (a server that prints `ready` once it listens) and waits for that line;
/// `failed` is the assertion's message otherwise.
fn started(mut command: Command, failed: &str) -> Child {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "{failed}");
    child
}

fn make_index(www: &Path) {
    let script = r#"
import os, sys, zipfile
d = sys.argv[1]
os.makedirs(f"{d}/simple/tinypkg")
whl = "tinypkg-0.1-py3-none-any.whl"
files = {
    "tinypkg/__init__.py": "VALUE = 'tiny-ok'\n",
    "tinypkg-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n",
    "tinypkg-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = "".join(f"{name},,\n" for name in files) + "tinypkg-0.1.dist-info/RECORD,,\n"
with zipfile.ZipFile(f"{d}/simple/tinypkg/{whl}", "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
    z.writestr("tinypkg-0.1.dist-info/RECORD", record)
open(f"{d}/simple/tinypkg/index.html", "w").write(f'<a href="{whl}">{whl}</a>\n')
open(f"{d}/simple/index.html", "w").write('<a href="tinypkg/">tinypkg</a>\n')
"#;
    run("/usr/bin/python3", &["-c", script, www.to_str().unwrap()]);
}

/// A CA and a server certificate for every test name, in `dir`; returns the CA's PEM.
fn make_certificates(dir: &Path) -> String {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "egress test upstream CA");
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let issuer =
        rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = NAMES.iter().map(|n| n.to_string()).collect();
    let cert = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    std::fs::write(dir.join("ca.pem"), issuer.pem()).unwrap();
    issuer.pem()
}

/// A relay whose egress proxy resolves the test names to `upstream` and trusts its CA.
fn relay_for(upstream: &Upstream) -> Relay {
    let hosts = upstream.hosts_file();
    let ca = upstream.dir.path().join("ca.pem");
    Relay::start_with(&[
        "--egress-hosts",
        hosts.to_str().unwrap(),
        "--egress-ca-file",
        ca.to_str().unwrap(),
    ])
}

/// Runs `script` in sandbox `id`; panics with its output unless it succeeds.
pub(crate) fn ok(relay: &Relay, id: &str, script: &str) -> String {
    let out = relay.sh(id, script);
    assert!(out.status.success(), "`{script}` failed: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `script` in sandbox `id`; panics unless it fails.
pub(crate) fn fails(relay: &Relay, id: &str, script: &str) -> String {
    let out = relay.sh(id, script);
    assert!(
        !out.status.success(),
        "`{script}` succeeded: {}",
        text(&out)
    );
    text(&out)
}

pub(crate) fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Writes the upstream's CA into the sandbox at /tmp/upstream-ca.pem.
pub(crate) fn trust_upstream(relay: &Relay, id: &str, upstream: &Upstream) {
    ok(
        relay,
        id,
        &format!("printf '%s' '{}' > /tmp/upstream-ca.pem", upstream.ca_pem),
    );
}

#[test]
fn allowed_names_work_and_everything_else_is_refused() {
    let upstream = Upstream::start();
    let mut relay = relay_for(&upstream);
    let id = relay.create(&[
        "--allow-host",
        "api.allowed.test",
        "--allow-host",
        "api.allowed-parent.test",
    ]);
    trust_upstream(&relay, &id, &upstream);

    // Allowed, by name: HTTP and HTTPS (passed through: the upstream's own certificate).
    let page = ok(&relay, &id, "curl -sSf http://api.allowed.test/");
    assert_eq!(page, "hello from upstream\n");
    let https = ok(
        &relay,
        &id,
        "curl -sSf --cacert /tmp/upstream-ca.pem https://api.allowed.test/echo",
    );
    assert!(https.contains("path: /echo"), "{https}");
    let fake = ok(
        &relay,
        &id,
        "python3 -c \"import socket; print(socket.gethostbyname('api.allowed.test'))\"",
    );
    let fake = fake.trim().to_string();
    assert!(fake.starts_with("198.1"), "not a fake address: {fake}");

    // HTTP clients are pointed at the explicit proxy; what they ask it is checked as below.
    let proxy = ok(&relay, &id, "echo \"$https_proxy $HTTP_PROXY $no_proxy\"");
    assert_eq!(
        proxy.trim(),
        "http://127.0.0.1:3128 http://127.0.0.1:3128 localhost,127.0.0.1,::1"
    );

    // Denied by name: the lookup fails, and the proxies answer 403 with the reason, in the
    // status line too (what a client that fails on a CONNECT prints).
    fails(&relay, &id, "getent hosts denied.test");
    fails(&relay, &id, "curl -sS --noproxy '*' https://denied.test/");
    let status = ok(
        &relay,
        &id,
        "curl -sS -o /dev/null -D - -x http://127.0.0.1:3128 http://denied.test/ | head -1",
    );
    assert!(
        status.starts_with(
            "HTTP/1.1 403 Forbidden by the sandbox's egress policy: denied.test is not on its \
             allowlist (allow it with --allow-host denied.test)"
        ),
        "{status}"
    );
    let python = fails(
        &relay,
        &id,
        "python3 -c \"import urllib.request; urllib.request.urlopen('https://denied.test/')\"",
    );
    assert!(
        python.contains("Forbidden by the sandbox's egress policy"),
        "{python}"
    );
    let explicit = ok(
        &relay,
        &id,
        "curl -sS -o /dev/stdout -w '\\n%{http_code}' -x http://127.0.0.1:3128 http://denied.test/",
    );
    assert!(explicit.ends_with("\n403"), "{explicit}");
    assert!(
        explicit
            .contains("egress policy refused this request: denied.test is not on its allowlist"),
        "{explicit}"
    );
    assert!(explicit.contains("--allow-host denied.test"), "{explicit}");
    let connect = fails(
        &relay,
        &id,
        "curl -sS -x http://127.0.0.1:3128 https://denied.test/",
    );
    assert!(connect.contains("403"), "{connect}");
    let host_header = ok(
        &relay,
        &id,
        "curl -sS --noproxy '*' -w '\\n%{http_code}' -H 'Host: denied.test' \
         http://api.allowed.test/",
    );
    assert!(host_header.ends_with("\n403"), "{host_header}");
    // A TLS server name that is not allowed, on a connection to an allowed name's address.
    fails(
        &relay,
        &id,
        &format!(
            "curl -sS --noproxy '*' --cacert /tmp/upstream-ca.pem \
             --resolve denied.test:443:{fake} https://denied.test/"
        ),
    );

    // Denied by address: raw TCP to the upstream, and UDP.
    let addr = upstream.addr;
    fails(
        &relay,
        &id,
        &format!("curl -sS --noproxy '*' --max-time 20 http://{addr}/"),
    );
    fails(
        &relay,
        &id,
        &format!(
            "python3 -c \"import socket; s = socket.create_connection(('{addr}', 9000), 20); \
             print(s.recv(10))\""
        ),
    );
    let _ = relay.sh(
        &id,
        &format!(
            "python3 -c \"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
             s.sendto(b'udp-from-sandbox', ('{addr}', 9999))\""
        ),
    );

    // DNS tunnelling: a name below an allowed parent, not itself allowed, fails, and no
    // query leaves, even one sent straight to the upstream's port 53.
    fails(&relay, &id, "getent hosts secretdata.allowed-parent.test");
    fails(&relay, &id, "getent hosts c2VjcmV0.allowed-parent.test");
    let _ = relay.sh(
        &id,
        &format!(
            "python3 -c \"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
             s.sendto(b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x04leak\\x04test\\x00\\x00\\x01\\x00\\x01', ('{addr}', 53))\""
        ),
    );
    let leaked = upstream.datagrams_from_sandboxes();
    assert!(leaked.is_empty(), "datagrams left the sandbox: {leaked:?}");

    // Nothing inside can undo the rules or the route.
    fails(&relay, &id, "ip route del default");
    fails(&relay, &id, "ip link set lo down");
    fails(&relay, &id, "nft flush ruleset");
    fails(&relay, &id, "iptables -P OUTPUT ACCEPT");
    ok(&relay, &id, "curl -sSf http://api.allowed.test/ >/dev/null");

    // A restarted relay serves the sandbox again, fake addresses it gave out included.
    relay.restart();
    let again = ok(&relay, &id, "curl -sSf http://api.allowed.test/");
    assert_eq!(again, "hello from upstream\n");
    ok(
        &relay,
        &id,
        &format!(
            "curl -sSf --noproxy '*' --resolve api.allowed.test:80:{fake} \
             http://api.allowed.test/"
        ),
    );
    fails(&relay, &id, "getent hosts denied.test");
}

#[test]
fn a_cidr_allowance_reaches_its_network_and_only_that() {
    let upstream = Upstream::start();
    let relay = relay_for(&upstream);
    let addr = upstream.addr;
    let id = relay.create(&["--allow-cidr", &format!("{addr}/32")]);
    let got = ok(
        &relay,
        &id,
        &format!(
            "python3 -c \"import socket; s = socket.create_connection(('{addr}', 9000), 20); \
             print(s.recv(10).decode().strip())\""
        ),
    );
    assert_eq!(got.trim(), "raw-ok");
    // Names stay refused: the allowance is by address only.
    fails(&relay, &id, "getent hosts api.allowed.test");
    // Another address of the host side of the veth is not in the network.
    let other = Ipv4Addr::from(u32::from(addr) - 1);
    fails(
        &relay,
        &id,
        &format!("curl -sS --noproxy '*' --max-time 20 http://{other}/"),
    );
}

#[test]
fn pip_installs_from_an_allowlisted_index() {
    let upstream = Upstream::start();
    let relay = relay_for(&upstream);
    let id = relay.create(&["--allow-host", "pypi.allowed.test"]);
    let out = ok(
        &relay,
        &id,
        "python3 -m pip install --quiet --no-cache-dir --disable-pip-version-check \
         --index-url http://pypi.allowed.test/simple/ --trusted-host pypi.allowed.test \
         --target /tmp/site tinypkg && PYTHONPATH=/tmp/site python3 -c \
         'import tinypkg; print(tinypkg.VALUE)'",
    );
    assert_eq!(out.trim(), "tiny-ok");
}

#[test]
fn bad_allowlists_are_refused_with_what_to_do() {
    let relay = Relay::start();
    let out = relay
        .tether()
        .args(["create", "--allow-host", "*.com"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("top-level domain"), "{}", text(&out));
    let out = relay
        .tether()
        .args(["create", "--allow-cidr", "10.1.2.3/16"])
        .output()
        .unwrap();
    assert!(text(&out).contains("10.1.0.0/16"), "{}", text(&out));
    // Local sandboxes have no IPv6 route: allowing an IPv6 network would promise what the
    // firewall then refuses, so the create is refused instead.
    let out = relay
        .tether()
        .args(["create", "--allow-cidr", "2001:db8::/32"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("IPv6 network 2001:db8::/32"),
        "{}",
        text(&out)
    );
    let out = relay
        .tether()
        .args(["create", "--network", "host", "--allow-host", "a.test"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("--network allowlist"), "{}", text(&out));
}

#[test]
fn a_secret_reaches_its_host_only_and_is_nowhere_inside() {
    const VALUE: &str = "sk-real-value-5f2c9e1d";
    let upstream = Upstream::start();
    let relay = relay_for(&upstream);
    let out = relay
        .tether()
        .env("TEST_API_KEY", VALUE)
        .args([
            "create",
            "--secret",
            "TEST_API_KEY@api.allowed.test",
            "--allow-host",
            "pypi.allowed.test",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    trust_upstream(&relay, &id, &upstream);

    let placeholder = ok(&relay, &id, "printf '%s' \"$TEST_API_KEY\"");
    assert!(placeholder.starts_with("tether-secret-"), "{placeholder}");

    // The secret's host receives the value: the sandbox trusts its CA through the environment.
    let echoed = ok(
        &relay,
        &id,
        "curl -sSf --noproxy '*' -H \"Authorization: Bearer $TEST_API_KEY\" \
         https://api.allowed.test/echo",
    );
    assert!(echoed.contains(&format!("Bearer {VALUE}")), "{echoed}");
    assert!(!echoed.contains(&placeholder), "{echoed}");
    // The same through the explicit proxy inside (CONNECT to 127.0.0.1:3128).
    let connected = ok(
        &relay,
        &id,
        "curl -sSf -x http://127.0.0.1:3128 -H \"Authorization: Bearer $TEST_API_KEY\" \
         https://api.allowed.test/echo",
    );
    assert!(
        connected.contains(&format!("Bearer {VALUE}")),
        "{connected}"
    );

    // Another allowed host gets the placeholder as sent (and is not intercepted: the
    // upstream's own certificate is what the sandbox sees).
    let elsewhere = ok(
        &relay,
        &id,
        "curl -sSf --cacert /tmp/upstream-ca.pem -H \"Authorization: Bearer $TEST_API_KEY\" \
         https://pypi.allowed.test/echo",
    );
    assert!(
        elsewhere.contains(&format!("Bearer {placeholder}")),
        "{elsewhere}"
    );
    assert!(!elsewhere.contains(VALUE), "{elsewhere}");

    // Inside, the value is nowhere: no process's environment or command line, no file the
    // sandbox can write or was given; and no CA key anywhere it can read. (The pattern ends
    // in a bracket expression, so the searching commands' own command lines do not match.)
    let (head, last) = VALUE.split_at(VALUE.len() - 1);
    let pattern = format!("{head}[{last}]");
    fails(
        &relay,
        &id,
        &format!("cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | grep -a '{pattern}'"),
    );
    let found = relay.sh(
        &id,
        &format!(
            "grep -rlsa '{pattern}' / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr \
             --exclude-dir=dev; grep -rlsa 'PRIVATE [K]EY' /etc /tmp /workspace /root"
        ),
    );
    assert_eq!(String::from_utf8_lossy(&found.stdout), "", "found inside");
    let ca = ok(
        &relay,
        &id,
        "cat /etc/tether/egress-ca.pem; echo $SSL_CERT_FILE",
    );
    assert!(ca.contains("BEGIN CERTIFICATE") && ca.ends_with("/etc/tether/ca-bundle.pem\n"));
}

#[test]
fn a_sandbox_of_an_oci_image_trusts_its_ca_through_the_images_own_bundle() {
    const VALUE: &str = "sk-oci-value-7c3e1a9b";
    let upstream = Upstream::start();
    let relay = relay_for(&upstream);
    let dir = tempfile::tempdir().unwrap();
    let root = crate::egress_cloud::curl_rootfs(dir.path());
    let layout = dir.path().join("image");
    tether_e2e::images::build(&root, &layout, &[]);
    let image = format!("oci:{}", layout.display());
    let out = relay
        .tether()
        .env("TEST_API_KEY", VALUE)
        .args(["create", "--image", &image])
        .args(["--secret", "TEST_API_KEY@api.allowed.test"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();

    // The image's system bundle now holds its own certificates and the sandbox's CA...
    let ca = ok(&relay, &id, "cat /etc/tether/egress-ca.pem");
    let bundle = ok(&relay, &id, "cat /etc/ssl/certs/ca-certificates.crt");
    let image_certs = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt"))
        .unwrap()
        .matches("BEGIN CERTIFICATE")
        .count();
    assert!(bundle.ends_with(&ca), "the bundle does not end with the CA");
    assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), image_certs + 1);
    // ...so a client that knows nothing of the variables trusts the interception, both
    // through the transparent route and through the explicit proxy.
    for proxy in ["--noproxy '*'", "-x http://127.0.0.1:3128"] {
        let echoed = ok(
            &relay,
            &id,
            &format!(
                "env -u SSL_CERT_FILE -u CURL_CA_BUNDLE -u REQUESTS_CA_BUNDLE curl -sSf {proxy} \
                 -H \"Authorization: Bearer $TEST_API_KEY\" https://api.allowed.test/echo"
            ),
        );
        assert!(
            echoed.contains(&format!("Bearer {VALUE}")),
            "{proxy}: {echoed}"
        );
    }
    // The bundle is read-only inside, and no key came with it.
    fails(&relay, &id, "echo x >> /etc/ssl/certs/ca-certificates.crt");
    let keys = relay.sh(&id, "grep -rl 'PRIVATE [K]EY' /etc /tmp /root");
    assert_eq!(String::from_utf8_lossy(&keys.stdout), "", "a key inside");
}

/// Runs the Python `script` in sandbox `id` (from stdin, so it needs no quoting).
fn python(relay: &Relay, id: &str, script: &str) -> String {
    ok(relay, id, &format!("python3 - <<'EOF'\n{script}\nEOF"))
}

/// The relay's open file descriptors.
fn descriptors(relay: &Relay) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", relay.pid()))
        .unwrap()
        .count()
}

#[test]
fn udp_reaches_an_allowed_network_and_nothing_else() {
    let upstream = Upstream::start();
    let _echo = upstream.udp_echo();
    let mut relay = relay_for(&upstream);
    let addr = upstream.addr;
    let id = relay.create(&["--allow-cidr", &format!("{addr}/32")]);

    // A connected socket: its datagrams arrive and the replies come from where it sent
    // (the kernel would drop them otherwise); an unconnected one sees that address too.
    let exchange = format!(
        "import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(20)
s.connect(('{addr}', {ECHO_PORT}))
for i in range(3):
    s.send(b'ping%d' % i)
    print(s.recv(100).decode())
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(20)
u.sendto(b'hello', ('{addr}', {ECHO_PORT}))
data, peer = u.recvfrom(100)
print(data.decode(), peer[0], peer[1])
u.sendto(b'udp-allowed-{id}', ('{addr}', 9999))"
    );
    let got = python(&relay, &id, &exchange);
    assert_eq!(
        got,
        format!("echo:ping0\necho:ping1\necho:ping2\necho:hello {addr} {ECHO_PORT}\n")
    );
    upstream.wait_for_datagram(&format!("udp-allowed-{id}"));

    // Port 53 of an allowed address is still the relay's DNS server: the query is answered
    // (NXDOMAIN, as the name is not allowed) and never reaches the upstream's port 53.
    let dns = python(
        &relay,
        &id,
        &format!(
            "import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(20)
s.connect(('{addr}', 53))
s.send(b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x04leak\\x04test\\x00\\x00\\x01\\x00\\x01')
reply = s.recv(512)
print(reply[:2].hex(), reply[3] & 15)"
        ),
    );
    assert_eq!(dns.trim(), "1234 3", "not the relay's NXDOMAIN: {dns}");

    // Another address (the host's end of the veth, outside the /32) and a fake address are
    // refused at once, and nothing arrives at the host's socket.
    let other = Ipv4Addr::from(u32::from(addr) - 1);
    let host = UdpSocket::bind((other, 0)).unwrap();
    let port = host.local_addr().unwrap().port();
    let refused = python(
        &relay,
        &id,
        &format!(
            "import socket
for dest in [('{other}', {port}), ('198.18.0.9', {ECHO_PORT})]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(b'must-not-arrive', dest)
        s.settimeout(2)
        print('answered', s.recvfrom(100))
    except OSError as e:
        print('refused', type(e).__name__)"
        ),
    );
    assert_eq!(
        refused, "refused PermissionError\nrefused PermissionError\n",
        "{refused}"
    );
    host.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    assert!(
        host.recv_from(&mut buf).is_err(),
        "a refused datagram arrived"
    );
    let leaked = upstream.datagrams_from_sandboxes();
    assert!(
        leaked.iter().all(|l| !l.starts_with("53 ")),
        "a DNS query left: {leaked:?}"
    );

    // A restarted relay relays UDP again (its policy route was already in the namespace).
    relay.restart();
    let again = python(
        &relay,
        &id,
        &format!(
            "import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(20)
s.connect(('{addr}', {ECHO_PORT}))
s.send(b'again')
print(s.recv(100).decode())"
        ),
    );
    assert_eq!(again, "echo:again\n");
}

#[test]
fn a_flood_of_udp_flows_stops_at_the_cap_and_leaves_no_socket_behind() {
    let upstream = Upstream::start();
    let _echo = upstream.udp_echo();
    let relay = relay_for(&upstream);
    let addr = upstream.addr;
    let id = relay.create(&["--allow-cidr", &format!("{addr}/32")]);
    let before = descriptors(&relay);

    // More sockets than the cap, each starting a flow (paced, so none is lost to a full
    // queue): the first MAX_UDP_FLOWS are answered, the rest dropped.
    let flood = format!(
        "import socket, time
socks = []
for i in range({}):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b'flow%d' % i, ('{addr}', {ECHO_PORT}))
    socks.append(s)
    time.sleep(0.002)
answered = 0
deadline = time.time() + 5
for s in socks:
    s.settimeout(max(0.01, deadline - time.time()))
    try:
        s.recv(100)
        answered += 1
    except OSError:
        pass
print(answered)",
        MAX_UDP_FLOWS + 64
    );
    let answered: usize = python(&relay, &id, &flood).trim().parse().unwrap();
    assert_eq!(answered, MAX_UDP_FLOWS, "answered flows");
    // Two sockets a flow, and nothing more.
    let during = descriptors(&relay);
    assert!(
        during <= before + 2 * MAX_UDP_FLOWS + 8,
        "{before} descriptors before the flood, {during} during it"
    );
    assert_eq!(ok(&relay, &id, "echo still-served"), "still-served\n");

    // Deleting the sandbox ends its flows: their sockets close.
    let rm = relay.tether().args(["rm", &id]).output().unwrap();
    assert!(rm.status.success(), "{}", text(&rm));
    let deadline = Instant::now() + READY_TIMEOUT;
    while descriptors(&relay) > before {
        assert!(
            Instant::now() < deadline,
            "{} descriptors after the delete, {before} before the flood",
            descriptors(&relay)
        );
        std::thread::sleep(POLL);
    }
}

/// Sends `CONNECT TARGET` to the explicit proxy inside a sandbox; prints the status line and,
/// when the proxy lets it through, the first line the destination says.
const CONNECT_PY: &str = "\
import socket, sys
s = socket.create_connection(('127.0.0.1', 3128), 20)
s.settimeout(20)
s.sendall(('CONNECT %s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n' % (sys.argv[1], sys.argv[1])).encode())
data = b''
while b'\\r\\n\\r\\n' not in data:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
head, _, rest = data.partition(b'\\r\\n\\r\\n')
status = head.split(b'\\r\\n')[0]
print('STATUS: ' + status.decode())
if b' 200 ' not in status + b' ':
    sys.exit(0)
try:
    s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')
    while b'\\n' not in rest:
        chunk = s.recv(4096)
        if not chunk:
            break
        rest += chunk
except OSError:
    pass
if rest:
    print('REPLY: ' + rest.split(b'\\n')[0].decode(errors='replace'))
";

/// A `tether` command with `token`.
fn tether_as(relay: &Relay, token: &str, args: &[&str]) -> Output {
    relay
        .tether()
        .env("TETHER_TOKEN", token)
        .args(args)
        .output()
        .unwrap()
}

/// A member token of `tenant`, minted by the relay's admin.
fn member_of(relay: &Relay, tenant: &str) -> String {
    let out = tether_as(
        relay,
        &relay.admin_token,
        &["token", "create", "--tenant", tenant],
    );
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A member may allow public networks only, and the networks its tenant's policy
/// (`egress_networks`) names: never the host's loopback (`0.0.0.0`), link-local and cloud
/// metadata, private ranges or the relay host's own addresses. Nobody may allow what lies
/// inside loopback or unspecified space.
#[test]
fn a_member_allows_only_what_the_policy_lets_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("policy.toml");
    std::fs::write(
        &config,
        "[tenants.team-b]\negress_networks = [\"10.128.0.0/16\"]\n",
    )
    .unwrap();
    let relay = Relay::start_with(&["--config", config.to_str().unwrap()]);
    let a = member_of(&relay, "team-a");
    for net in [
        "0.0.0.0/0",
        "169.254.169.254/32",
        "10.0.0.0/8",
        "192.168.1.0/24",
        "100.64.0.0/10",
    ] {
        let out = tether_as(&relay, &a, &["create", "--allow-cidr", net]);
        assert!(!out.status.success(), "{net} was allowed: {}", text(&out));
        let said = text(&out);
        assert!(said.contains(net), "{net}: {said}");
        assert!(said.contains("egress_networks"), "{net}: {said}");
        assert!(said.contains("public addresses only"), "{net}: {said}");
    }
    // The issue's attack: 0.0.0.0 is the host's loopback.
    for net in ["0.0.0.0/32", "127.0.0.2/32"] {
        let out = tether_as(&relay, &a, &["create", "--allow-cidr", net]);
        assert!(!out.status.success(), "{net} was allowed: {}", text(&out));
        assert!(
            text(&out).contains("nothing can allow it"),
            "{}",
            text(&out)
        );
    }
    // The policy's networks, and public ones, are the member's to allow.
    let b = member_of(&relay, "team-b");
    let out = tether_as(&relay, &b, &["create", "--allow-cidr", "10.1.0.0/16"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("10.128.0.0/16"), "{}", text(&out));
    let out = tether_as(
        &relay,
        &b,
        &[
            "create",
            "--allow-cidr",
            "10.128.4.0/24",
            "--allow-cidr",
            "198.51.100.0/24",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    // Not even an admin allows the host's loopback.
    for net in ["0.0.0.0/32", "127.0.0.0/8"] {
        let out = tether_as(&relay, &relay.admin_token, &["create", "--allow-cidr", net]);
        assert!(!out.status.success(), "{net}: {}", text(&out));
        assert!(
            text(&out).contains("nothing can allow it"),
            "{}",
            text(&out)
        );
    }
}

/// Whatever an admin allowed, no way through the proxy leads to the relay's own host: not
/// `0.0.0.0` or any other loopback form, literal or from the hosts file, and not the host's
/// own non-loopback address (here the host end of the test's veth), by address or by a name
/// the hosts file points there; while the upstream beside it stays reachable.
#[test]
fn no_allowance_or_name_reaches_the_relays_own_host() {
    let upstream = Upstream::start();
    let host_addr = Ipv4Addr::from(u32::from(upstream.addr) - 1);
    // A service of the host on its own (veth) address, as the relay's API or a tenant's
    // forwarded port would be.
    let service = std::net::TcpListener::bind((host_addr, 0)).unwrap();
    let service_port = service.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in service.incoming().take(16) {
            let Ok(mut conn) = conn else { return };
            let _ = std::io::Write::write_all(&mut conn, b"host-service-reached\n");
        }
    });
    let hosts = upstream.dir.path().join("hosts");
    std::fs::write(
        &hosts,
        format!(
            "{} {}\n{host_addr} own.test\n0.0.0.0 zero.test\n127.0.0.2 loop.test\n\
             ::ffff:127.0.0.1 mapped.test\n",
            upstream.addr,
            NAMES.join(" ")
        ),
    )
    .unwrap();
    let relay = Relay::start_with(&["--egress-hosts", hosts.to_str().unwrap()]);
    let relay_port = relay.url.rsplit(':').next().unwrap().to_string();
    let net = format!(
        "{}/16",
        Ipv4Addr::from(u32::from(upstream.addr) & 0xffff_0000)
    );
    let mut args = vec!["--allow-cidr", net.as_str()];
    for name in ["own.test", "zero.test", "loop.test", "mapped.test"] {
        args.extend(["--allow-host", name]);
    }
    let id = relay.create(&args);
    ok(
        &relay,
        &id,
        &format!("cat > /tmp/connect.py <<'PY'\n{CONNECT_PY}PY"),
    );
    let run = |target: &str| {
        let out = relay.sh(&id, &format!("python3 /tmp/connect.py '{target}'"));
        text(&out)
    };

    // The control: the upstream, in the same allowed network, is reached.
    let reached = run(&format!("{}:9000", upstream.addr));
    assert!(reached.contains("REPLY: raw-ok"), "{reached}");

    for target in [
        format!("{host_addr}:{service_port}"),
        format!("own.test:{service_port}"),
        format!("0.0.0.0:{relay_port}"),
        format!("zero.test:{relay_port}"),
        format!("127.0.0.2:{relay_port}"),
        format!("loop.test:{relay_port}"),
        format!("[::ffff:127.0.0.1]:{relay_port}"),
        format!("mapped.test:{relay_port}"),
    ] {
        let said = run(&target);
        assert!(said.contains("STATUS: "), "{target}: {said}");
        assert!(!said.contains("REPLY: "), "{target} was reached: {said}");
    }
    // By address, the refusal says why.
    let said = run(&format!("{host_addr}:{service_port}"));
    assert!(said.contains("STATUS: HTTP/1.1 403"), "{said}");
    // Transparent TCP to the host's address, allowed network or not, does not arrive either.
    let said = text(&relay.sh(
        &id,
        &format!(
            "python3 -c \"import socket; s = socket.create_connection(('{host_addr}', \
             {service_port}), 20); print(s.recv(64))\""
        ),
    ));
    assert!(!said.contains("host-service-reached"), "{said}");
}

/// An upstream that echoes the `Basic` credentials the proxy put the secret into (base64 of
/// `user:VALUE`) hands the sandbox back its own credentials with the placeholder, never the
/// value.
#[test]
fn an_echoed_basic_credential_goes_back_as_the_placeholder() {
    const VALUE: &str = "sk-basic-value-3e8d1f0a";
    let upstream = Upstream::start();
    let relay = relay_for(&upstream);
    let out = relay
        .tether()
        .env("TEST_API_KEY", VALUE)
        .args(["create", "--secret", "TEST_API_KEY@api.allowed.test"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let placeholder = ok(&relay, &id, "printf '%s' \"$TEST_API_KEY\"");

    // The upstream got the value (its /echo shows the decoded credentials it received).
    let received = ok(
        &relay,
        &id,
        "curl -sSf -u \"user:$TEST_API_KEY\" https://api.allowed.test/echo | \
         sed -n 's/^[Aa]uthorization: Basic //p' | base64 -d",
    );
    assert_eq!(received, format!("user:{VALUE}"));

    let echoed = ok(
        &relay,
        &id,
        "curl -sS -o /dev/null -D - -u \"user:$TEST_API_KEY\" \
         https://api.allowed.test/echo-header | tr -d '\\r' | \
         sed -n 's/^[Xx]-[Ee]cho-[Aa]uthorization: Basic //p' | base64 -d",
    );
    assert_eq!(echoed, format!("user:{placeholder}"));
    assert!(!echoed.contains(VALUE));
}
