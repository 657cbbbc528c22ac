//! The relay behind TLS (`tether serve --tls-cert --tls-key`), end to end: a CA and server
//! certificates made here with rcgen, the real relay serving HTTPS and WSS, the real CLI
//! trusting the CA through `TETHER_CA_CERT`. And the attacks: no CA, another CA, a
//! certificate for another name, plain HTTP and garbage on the TLS port, bad flags and files.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use serde_json::Value;
use tempfile::TempDir;
use tether_e2e::{bin, wait_within, Relay};

/// How long `tether serve` may take to refuse bad flags or files.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a good client may take while others stall their handshakes: under the relay's
/// 10 s handshake timeout, so a relay that handshakes one connection at a time fails.
const STALL_BOUND: Duration = Duration::from_secs(8);
/// How long a raw socket waits for the relay's answer.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(15);

/// A certificate authority of the test's own, writing its files into a temporary directory.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: TempDir,
    /// Its certificate, for `TETHER_CA_CERT`.
    pem: PathBuf,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let pem = dir.path().join(format!("{name}-ca.pem"));
        std::fs::write(&pem, issuer.pem()).unwrap();
        Ca { issuer, dir, pem }
    }

    /// A server certificate for `names` (host names or IP addresses) and its key, as files.
    fn issue(&self, file: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "tether relay");
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let cert_path = self.dir.path().join(format!("{file}.crt"));
        let key_path = self.dir.path().join(format!("{file}.key"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    /// A relay serving TLS with a certificate of this CA for 127.0.0.1 and localhost.
    fn relay(&self) -> Relay {
        let (cert, key) = self.issue("relay", &["127.0.0.1", "localhost"]);
        let relay = Relay::start_tls(&cert, &key, &self.pem);
        assert!(relay.url.starts_with("https://127.0.0.1:"), "{}", relay.url);
        relay
    }
}

fn run(mut cmd: Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("run tether")
}

fn ok(cmd: Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "tether failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs a command that must fail; its stderr.
fn fails(cmd: Command) -> String {
    let out = run(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "it succeeded; stderr: {stderr}");
    stderr
}

/// `tether ARGS` against `relay`, with the token but trusting `ca` (`None`: no CA at all).
fn tether_trusting(relay: &Relay, ca: Option<&Path>, args: &[&str]) -> Command {
    let mut cmd = relay.tether();
    cmd.env_remove("TETHER_CA_CERT").args(args);
    if let Some(ca) = ca {
        cmd.env("TETHER_CA_CERT", ca);
    }
    cmd
}

fn port(relay: &Relay) -> u16 {
    relay.url.rsplit_once(':').unwrap().1.parse().unwrap()
}

#[test]
fn the_cli_works_over_https_and_wss() {
    let ca = Ca::new("good");
    let relay = ca.relay();
    let id = relay.create(&[]);

    // exec's output and exit status cross the wss:// tunnel intact.
    let out = relay.sh(&id, "echo hello; echo oops >&2; exit 3");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("oops"),
        "{out:?}"
    );

    let mut ls = relay.tether();
    ls.arg("ls");
    assert!(ok(ls).contains(&id));

    // cp both ways, through REST and the tunnel.
    let dir = tempfile::tempdir().unwrap();
    let up = dir.path().join("up.bin");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&up, &data).unwrap();
    let mut cp = relay.tether();
    cp.args(["cp", up.to_str().unwrap(), &format!("{id}:/tmp/up.bin")]);
    ok(cp);
    let down = dir.path().join("down.bin");
    let mut cp = relay.tether();
    cp.args(["cp", &format!("{id}:/tmp/up.bin"), down.to_str().unwrap()]);
    ok(cp);
    assert_eq!(std::fs::read(&down).unwrap(), data);

    // The relay's own URLs say https.
    let mut info = relay.tether();
    info.args(["info", &id, "--json"]);
    let info: Value = serde_json::from_str(&ok(info)).unwrap();
    assert!(info["agent"].is_object(), "{info}");
    let previews = &info["previews"];
    for url in ["host_url", "path_url"] {
        let url = previews[url].as_str().unwrap_or_default();
        assert!(url.starts_with("https://"), "{info}");
    }

    // By name as well as by address.
    let mut exec = relay.tether();
    exec.env(
        "TETHER_RELAY",
        format!("https://localhost:{}", port(&relay)),
    )
    .args(["exec", &id, "--", "echo", "by name"]);
    assert_eq!(ok(exec), "by name\n");
}

#[test]
fn without_the_ca_the_error_names_the_problem_and_the_variable() {
    let ca = Ca::new("good");
    let relay = ca.relay();
    let id = relay.create(&[]);
    let other = Ca::new("other");

    for trusted in [None, Some(other.pem.as_path())] {
        // The WebSocket (exec) and REST (ls) alike.
        for args in [&["exec", &id, "--", "true"][..], &["ls"]] {
            let err = fails(tether_trusting(&relay, trusted, args));
            assert!(err.contains("UnknownIssuer"), "{args:?}: {err}");
            assert!(err.contains("TETHER_CA_CERT"), "{args:?}: {err}");
            assert!(!err.contains("tether serve"), "{args:?}: {err}");
        }
    }
    // The sandbox was never reached: it still answers to a trusting client.
    assert_eq!(relay.sh(&id, "echo still").stdout, b"still\n");
}

#[test]
fn a_certificate_for_another_name_is_refused() {
    let ca = Ca::new("good");
    let (cert, key) = ca.issue("elsewhere", &["example.invalid"]);
    let relay = Relay::start_tls(&cert, &key, &ca.pem);
    for args in [&["exec", "sb-1", "--", "true"][..], &["ls"]] {
        let err = fails(tether_trusting(&relay, Some(&ca.pem), args));
        assert!(
            err.contains("not valid for the host name"),
            "{args:?}: {err}"
        );
        assert!(
            err.contains("certificate not valid for name"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_self_signed_certificate_is_its_own_ca_unless_it_says_it_is_a_ca() {
    let dir = tempfile::tempdir().unwrap();
    let self_signed = |name: &str, ca: bool| {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        if ca {
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (cert_path, key_path) = (
            dir.path().join(format!("{name}.crt")),
            dir.path().join(format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    };

    // An end-entity certificate (CA:FALSE), trusted as itself: what the README's openssl
    // line makes.
    let (cert, key) = self_signed("plain", false);
    let relay = Relay::start_tls(&cert, &key, &cert);
    let id = relay.create(&[]);
    assert_eq!(relay.sh(&id, "echo self-signed").stdout, b"self-signed\n");

    // One that says CA:TRUE is refused even when trusted, and the error says what to change.
    let (cert, key) = self_signed("ca", true);
    let relay = Relay::start_tls(&cert, &key, &cert);
    let err = fails(tether_trusting(&relay, Some(&cert), &["ls"]));
    assert!(err.contains("CaUsedAsEndEntity"), "{err}");
    assert!(err.contains("CA:FALSE"), "{err}");
}

#[test]
fn a_bad_ca_file_is_an_error_not_ignored() {
    let ca = Ca::new("good");
    let relay = ca.relay();
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let missing = dir.path().join("missing.pem");
    for (file, says) in [
        (&garbage, "holds no certificate"),
        (&missing, "cannot read"),
    ] {
        for args in [&["exec", "sb-1", "--", "true"][..], &["ls"]] {
            let err = fails(tether_trusting(&relay, Some(file), args));
            assert!(err.contains(says), "{args:?}: {err}");
            assert!(
                err.contains(&format!("TETHER_CA_CERT={}", file.display())),
                "{args:?}: {err}"
            );
        }
    }
}

#[test]
fn plain_http_garbage_and_silence_on_the_tls_port_leave_it_serving() {
    let ca = Ca::new("good");
    let relay = ca.relay();
    let id = relay.create(&[]);
    let addr = format!("127.0.0.1:{}", port(&relay));

    // Clients that connect and say nothing, or start a ClientHello and stop, hold up nobody
    // else: each handshake runs on its own (checked at the end).
    let mut stalled: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let mut partial = TcpStream::connect(&addr).unwrap();
    partial.write_all(b"\x16\x03\x01\x02\x00\x01").unwrap();
    stalled.push(partial);

    // An http:// client is told to use https://, REST and WebSocket alike.
    for args in [&["exec", &id, "--", "true"][..], &["ls"]] {
        let mut cmd = tether_trusting(&relay, Some(&ca.pem), args);
        cmd.env("TETHER_RELAY", format!("http://{addr}"));
        let err = fails(cmd);
        assert!(err.contains("serves HTTPS only"), "{args:?}: {err}");
        assert!(err.contains("https://"), "{args:?}: {err}");
    }

    // A raw plaintext request gets a well-formed 400 and a closed connection.
    let mut plain = TcpStream::connect(&addr).unwrap();
    plain.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
    plain
        .write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    plain.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.contains("\"tls_required\""), "{answer}");

    // Garbage in place of a ClientHello: the relay closes the connection.
    for garbage in [&b"\x16\x03\x01\x00\x05hello"[..], &[0xff; 4096], b"\x00"] {
        let mut raw = TcpStream::connect(&addr).unwrap();
        raw.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
        raw.write_all(garbage).unwrap();
        let mut rest = Vec::new();
        // A TLS alert at most, then the end of the stream (or a reset).
        let _ = raw.read_to_end(&mut rest);
        assert!(rest.len() < 64, "{} bytes back", rest.len());
    }

    // And the next good client is served, well before the stalled handshakes time out.
    let started = Instant::now();
    assert_eq!(relay.sh(&id, "echo fine").stdout, b"fine\n");
    assert!(
        started.elapsed() < STALL_BOUND,
        "a good client waited {:?} behind stalled handshakes",
        started.elapsed()
    );
    drop(stalled);
}

/// Runs `tether serve ARGS` on a free port, which must exit with an error; its stderr.
fn serve_refuses(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin("tether"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .args(args)
        .env("TETHER_AGENT_BIN", bin("tether-agent"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_within(
        &mut child,
        REFUSE_TIMEOUT,
        &format!("tether serve {args:?}"),
    );
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!status.success(), "{stderr}");
    stderr
}

#[test]
fn serve_refuses_bad_tls_flags_and_files() {
    let ca = Ca::new("good");
    let (cert, key) = ca.issue("relay", &["127.0.0.1"]);
    let (_, other_key) = ca.issue("other", &["127.0.0.1"]);
    let (cert, key, other_key) = (
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
        other_key.to_str().unwrap(),
    );

    // One flag without the other.
    let err = serve_refuses(&["--tls-cert", cert]);
    assert!(err.contains("--tls-key"), "{err}");
    let err = serve_refuses(&["--tls-key", key]);
    assert!(err.contains("--tls-cert"), "{err}");

    // A file that is missing, or holds the wrong thing: named, with what is wrong.
    let err = serve_refuses(&["--tls-cert", "/nonexistent/relay.crt", "--tls-key", key]);
    assert!(
        err.contains("cannot read the TLS certificate /nonexistent/relay.crt"),
        "{err}"
    );
    let err = serve_refuses(&["--tls-cert", key, "--tls-key", key]);
    assert!(
        err.contains(&format!("{key} holds no certificate")),
        "{err}"
    );
    let err = serve_refuses(&["--tls-cert", cert, "--tls-key", cert]);
    assert!(
        err.contains(&format!("{cert} holds no private key")),
        "{err}"
    );
    // A key of another certificate.
    let err = serve_refuses(&["--tls-cert", cert, "--tls-key", other_key]);
    assert!(err.contains("cannot be used with the certificate"), "{err}");
    assert!(err.contains(other_key), "{err}");
}
