//! Preview URLs: headless Chromium opens a page served inside a sandbox through the relay,
//! a missing or wrong token is refused (with the same answer as an unknown sandbox id), and
//! WebSocket upgrades pass through, by host name and by path.
//!
//! Needs Debian's `chromium` package (`apt-get install -y chromium`).

use crate::servers;

use futures_util::{SinkExt, StreamExt};
use tether_e2e::Relay;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const PAGE: &str = "<!doctype html><title>preview</title><h1>hello from the sandbox</h1>\
                    <script>document.body.insertAdjacentHTML('beforeend', '<p>script ran</p>')</script>";

/// The DOM headless Chromium ends up with at `url`.
fn browser_dom(url: &str) -> String {
    browser_dom_resolving(url, &[])
}

/// The same, with Chromium's resolver told `rules` (`MAP *.preview.test 127.0.0.1`): a
/// wildcard DNS record, as an operator of a preview domain sets one up.
fn browser_dom_resolving(url: &str, rules: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = tether_e2e::require::command("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args((!rules.is_empty()).then(|| format!("--host-resolver-rules={}", rules.join(", "))))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("run chromium");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn a_browser_opens_the_preview_and_wrong_tokens_are_refused() {
    let relay = Relay::start();
    let client = relay.client();
    let id = client.create(&Default::default()).await.unwrap().id;
    let s = client.connect(&id).await.unwrap();
    servers::http_site(&s, 8000, PAGE).await;
    let preview = client.preview(&id).await.unwrap();

    let dom = browser_dom(&preview.url(8000));
    assert!(
        dom.contains("hello from the sandbox"),
        "the page did not load: {dom}"
    );
    assert!(
        dom.contains("script ran"),
        "the page's script did not run: {dom}"
    );
    let dom = browser_dom(&preview.path(8000));
    assert!(
        dom.contains("hello from the sandbox"),
        "the path form did not load: {dom}"
    );

    let addr = relay.url.trim_start_matches("http://");
    let port = addr.rsplit(':').next().unwrap();
    let host = format!("8000-{id}.localhost:{port}");
    let none = servers::get(addr, &host, "/", &[]).await;
    assert_eq!(none.status, 401, "{none:?}");
    assert!(none.body.contains("without its token"), "{none:?}");
    let wrong = servers::get(
        addr,
        &host,
        "/?tether_preview_token=0123456789abcdef0123456789abcdef",
        &[],
    )
    .await;
    assert_eq!((wrong.status, &wrong.body), (401, &none.body), "{wrong:?}");
    assert!(!wrong.body.contains("hello from the sandbox"));
    let forged = servers::get(addr, &host, "/", &[("Cookie", "tether_preview=forged")]).await;
    assert_eq!(forged.status, 401, "{forged:?}");

    // A program gets the page at once, by host name and by path: not every client follows
    // a redirect or keeps a cookie.
    let query = format!("index.html?tether_preview_token={}", preview.token);
    for (host, path) in [
        (host.as_str(), format!("/{query}")),
        (addr, format!("/preview/{id}/8000/{query}")),
    ] {
        let page = servers::get(addr, host, &path, &[("Accept", "*/*")]).await;
        assert_eq!((page.status, page.body.as_str()), (200, PAGE), "{path}");
    }

    // For a browser, the query token becomes a cookie and leaves the URL.
    let first = servers::get(
        addr,
        &host,
        &format!("/index.html?tether_preview_token={}", preview.token),
        &[
            ("Sec-Fetch-Mode", "navigate"),
            ("Accept", "text/html,application/xhtml+xml,*/*;q=0.8"),
        ],
    )
    .await;
    assert_eq!(first.status, 303, "{first:?}");
    assert!(
        first.head.contains("location: /index.html\r\n"),
        "{first:?}"
    );
    assert!(
        first
            .head
            .contains(&format!("set-cookie: tether_preview={}", preview.token)),
        "{first:?}"
    );
    let cookie = format!("tether_preview={}", preview.token);
    let page = servers::get(addr, &host, "/index.html", &[("Cookie", &cookie)]).await;
    assert_eq!((page.status, page.body.as_str()), (200, PAGE));
    // The header works too, on the path form.
    let path = format!("/preview/{id}/8000/index.html");
    let page = servers::get(
        addr,
        addr,
        &path,
        &[("X-Tether-Preview-Token", &preview.token)],
    )
    .await;
    assert_eq!((page.status, page.body.as_str()), (200, PAGE));
}

/// A relay reached over the network serves previews under the domain it is given
/// (`--preview-domain`), whose wildcard record points at it: the URL it hands out names that
/// domain, a browser opens it, names that only look like it are the API's, and
/// `*.localhost` keeps working beside it.
#[tokio::test]
async fn a_preview_domain_serves_previews_under_its_wildcard_names() {
    let relay = Relay::start_with(&["--preview-domain", "Previews.Example.TEST."]);
    let client = relay.client();
    let id = client.create(&Default::default()).await.unwrap().id;
    let s = client.connect(&id).await.unwrap();
    servers::http_site(&s, 8000, PAGE).await;
    let preview = client.preview(&id).await.unwrap();
    let addr = relay.url.trim_start_matches("http://");
    let port = addr.rsplit(':').next().unwrap();
    assert_eq!(
        preview.url(8000).split('?').next().unwrap(),
        format!("http://8000-{id}.previews.example.test:{port}/"),
    );

    // Chromium, resolving the wildcard name to the relay as DNS would.
    let dom = browser_dom_resolving(
        &preview.url(8000),
        &["MAP *.previews.example.test 127.0.0.1"],
    );
    assert!(
        dom.contains("hello from the sandbox"),
        "the page did not load under the preview domain: {dom}"
    );

    let token = [("X-Tether-Preview-Token", preview.token.as_str())];
    for host in [
        format!("8000-{id}.previews.example.test:{port}"),
        format!("8000-{}.PREVIEWS.example.test", id.to_uppercase()),
        format!("8000-{id}.localhost:{port}"),
    ] {
        let page = servers::get(addr, &host, "/", &token).await;
        assert_eq!((page.status, page.body.as_str()), (200, PAGE), "{host}");
    }
    // Look-alikes are no preview: they reach the API, which has no such path, and the app
    // never sees the request.
    for host in [
        format!("8000-{id}.previews.example.test.evil.net"),
        format!("8000-{id}.xpreviews.example.test"),
        format!("8000-{id}xpreviews.example.test"),
        format!("8000-{id}.example.test"),
        "previews.example.test".to_string(),
    ] {
        let answer = servers::get(addr, &host, "/", &token).await;
        assert_ne!(answer.body, PAGE, "{host} reached the app");
        assert_eq!(answer.status, 404, "{host}: {answer:?}");
    }
    // Without the token, the domain's names refuse as the localhost ones do.
    let none = servers::get(addr, &format!("8000-{id}.previews.example.test"), "/", &[]).await;
    assert_eq!(none.status, 401, "{none:?}");
}

#[tokio::test]
async fn a_relay_refuses_a_preview_domain_that_cannot_work() {
    for (domain, reason) in [
        ("*.previews.example.test", "not a DNS label"),
        ("previews", "one label"),
        ("sandboxes.localhost", "localhost already"),
    ] {
        let data = tempfile::tempdir().unwrap();
        let mut serve = std::process::Command::new(tether_e2e::bin("tether"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--preview-domain",
                domain,
            ])
            .arg("--data-dir")
            .arg(data.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A relay that took the domain would serve on: stopped after the limit, failing.
        let status = tether_e2e::wait_within(
            &mut serve,
            std::time::Duration::from_secs(20),
            &format!("tether serve --preview-domain {domain}"),
        );
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut serve.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(!status.success(), "{domain} was accepted");
        assert!(
            stderr.contains(reason) && stderr.contains("wildcard record"),
            "{domain}: {stderr}"
        );
    }
}

/// Whether a sandbox id exists must not show: an unknown id, a missing token and a wrong
/// one get the same status and the same body, by host name and by path.
#[tokio::test]
async fn unknown_ids_and_wrong_tokens_get_the_same_answer() {
    let relay = Relay::start();
    let client = relay.client();
    let id = client.create(&Default::default()).await.unwrap().id;
    let s = client.connect(&id).await.unwrap();
    servers::http_site(&s, 8000, PAGE).await;
    let preview = client.preview(&id).await.unwrap();
    let addr = relay.url.trim_start_matches("http://");
    let port = addr.rsplit(':').next().unwrap();
    let wrong = "0123456789abcdef0123456789abcdef";
    let unknown = format!("sb-{}", &tether_e2e::token()[..8]);

    let mut answers = Vec::new();
    for sandbox in [id.as_str(), unknown.as_str()] {
        let host = format!("8000-{sandbox}.localhost:{port}");
        let path = format!("/preview/{sandbox}/8000/");
        for (host, path) in [(host.as_str(), "/"), (addr, path.as_str())] {
            for query in ["", "?tether_preview_token=0123456789abcdef0123456789abcdef"] {
                let r = servers::get(addr, host, &format!("{path}{query}"), &[]).await;
                answers.push((r.status, r.body));
            }
            let r = servers::get(addr, host, path, &[("X-Tether-Preview-Token", wrong)]).await;
            answers.push((r.status, r.body));
            let r = servers::get(addr, host, path, &[("Cookie", "tether_preview=forged")]).await;
            answers.push((r.status, r.body));
        }
    }
    assert_eq!(answers.len(), 16);
    for answer in &answers {
        assert_eq!(answer, &answers[0], "answers differ: {answers:#?}");
    }
    assert_eq!(answers[0].0, 401);
    assert!(!answers[0].1.contains(&id), "{answers:?}");
    // The right token still opens it.
    let host = format!("8000-{id}.localhost:{port}");
    let page = servers::get(
        addr,
        &host,
        "/",
        &[("X-Tether-Preview-Token", &preview.token)],
    )
    .await;
    assert_eq!((page.status, page.body.as_str()), (200, PAGE));
}

#[tokio::test]
async fn websockets_pass_through_previews() {
    let relay = Relay::start();
    let client = relay.client();
    let id = client.create(&Default::default()).await.unwrap().id;
    let s = client.connect(&id).await.unwrap();
    servers::ws_echo(&s, 9001).await;
    let preview = client.preview(&id).await.unwrap();
    let addr = relay.url.trim_start_matches("http://").to_string();

    // By path, the token in the query (a WebSocket is proxied, not redirected).
    let url = preview.path(9001).replace("http://", "ws://");
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("WebSocket by path");
    ws.send(Message::Text("by path".into())).await.unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::Text("by path".into())
    );
    ws.close(None).await.unwrap();

    // By host name (sent by hand: the resolver need not know `*.localhost`), token in a header.
    let port = addr.rsplit(':').next().unwrap();
    let mut request = format!("ws://9001-{id}.localhost:{port}/")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("x-tether-preview-token", preview.token.parse().unwrap());
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(request, tcp)
        .await
        .expect("WebSocket by host");
    ws.send(Message::Binary(vec![1u8, 2, 3].into()))
        .await
        .unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::Binary(vec![1u8, 2, 3].into())
    );
    ws.close(None).await.unwrap();

    // Without the token the upgrade is refused.
    let bad = format!("ws://{addr}/preview/{id}/9001/")
        .into_client_request()
        .unwrap();
    assert!(tokio_tungstenite::connect_async(bad).await.is_err());
}

#[tokio::test]
async fn tether_info_prints_preview_urls_that_serve_the_page() {
    let relay = Relay::start();
    let client = relay.client();
    let id = client.create(&Default::default()).await.unwrap().id;
    let s = client.connect(&id).await.unwrap();
    servers::http_site(&s, 8000, PAGE).await;

    let out = relay.tether().args(["info", &id]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "tether info failed: {text}");
    let find = |needle: &str| {
        text.split_whitespace()
            .find(|w| w.contains(needle))
            .unwrap_or_else(|| panic!("no {needle} in:\n{text}"))
            .to_string()
    };
    let by_host = find(&format!("http://8000-{id}.localhost:"));
    let by_path = find(&format!("/preview/{id}/8000/"));
    let token = text
        .lines()
        .find_map(|l| l.strip_prefix("preview token:"))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no preview token line in:\n{text}"))
        .to_string();

    let dom = browser_dom(&by_host);
    assert!(
        dom.contains("hello from the sandbox"),
        "{by_host} did not serve the page: {dom}"
    );
    // The path form, with the token passed as the header `tether info` names.
    let addr = relay.url.trim_start_matches("http://");
    let path = by_path
        .split_once(addr)
        .map(|(_, p)| p.split('?').next().unwrap().to_string())
        .unwrap_or_else(|| panic!("{by_path} is not on the relay's address {addr}"));
    let page = servers::get(addr, addr, &path, &[("X-Tether-Preview-Token", &token)]).await;
    assert_eq!((page.status, page.body.as_str()), (200, PAGE));

    let out = relay
        .tether()
        .args(["info", "--json", &id])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ports = json["previews"]["ports"]
        .as_array()
        .expect("previews.ports");
    assert!(
        ports
            .iter()
            .any(|p| p["port"] == 8000 && p["url"] == by_host.as_str()),
        "{json}"
    );
}

/// An app that answers every GET with the request headers it received, one per line.
const HEADER_ECHO: &str = "\
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ''.join(f'{k}: {v}\\n' for k, v in self.headers.items()).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
";

/// A preview hands the app what the browser sent, less the relay's credentials: a relay API
/// token in `Authorization` (as a bearer token or inside `Basic`), `Proxy-Authorization`, and
/// the preview token in its header or cookie. The app's own `Authorization` and cookies pass.
#[tokio::test]
async fn the_app_never_sees_the_relays_credentials_and_keeps_its_own() {
    let relay = Relay::start();
    let client = relay.client();
    let id = client.create(&Default::default()).await.unwrap().id;
    let s = client.connect(&id).await.unwrap();
    servers::start(&s, &["python3", "-c", HEADER_ECHO, "8010"], 8010).await;
    let preview = client.preview(&id).await.unwrap();
    let addr = relay.url.trim_start_matches("http://");
    let port = addr.rsplit(':').next().unwrap();
    let host = format!("8010-{id}.localhost:{port}");
    let cookie = format!("tether_preview={}; app_session=s-42", preview.token);

    let basic = base64(&format!("x:{}", relay.admin_token));
    for relay_auth in [
        format!("Bearer {}", relay.admin_token),
        format!("Basic {basic}"),
        format!("Bearer {}", preview.token),
    ] {
        let seen = servers::get(
            addr,
            &host,
            "/",
            &[
                ("Authorization", &relay_auth),
                ("Proxy-Authorization", "Basic cHJveHk6c2VjcmV0"),
                ("Cookie", &cookie),
            ],
        )
        .await;
        assert_eq!(seen.status, 200, "{seen:?}");
        let body = seen.body.to_lowercase();
        assert!(
            !body.contains("authorization"),
            "{relay_auth}: {}",
            seen.body
        );
        assert!(!seen.body.contains(&relay.admin_token), "{}", seen.body);
        assert!(!seen.body.contains(&preview.token), "{}", seen.body);
        assert!(seen.body.contains("app_session=s-42"), "{}", seen.body);
    }

    // The app's own credentials reach it, by host name and by path.
    let own = servers::get(
        addr,
        &host,
        "/",
        &[
            ("Authorization", "Bearer app-issued-7f3a"),
            ("Cookie", &cookie),
        ],
    )
    .await;
    assert!(own.body.contains("Bearer app-issued-7f3a"), "{own:?}");
    let path = format!("/preview/{id}/8010/");
    let own = servers::get(
        addr,
        addr,
        &path,
        &[
            ("X-Tether-Preview-Token", &preview.token),
            ("Authorization", "Basic dXNlcjpwYXNz"),
        ],
    )
    .await;
    assert!(own.body.contains("Basic dXNlcjpwYXNz"), "{own:?}");
    assert!(
        !own.body.to_lowercase().contains("x-tether-preview-token"),
        "{own:?}"
    );
}

/// `text` in standard base64, by coreutils' `base64`.
fn base64(text: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("base64")
        .arg("-w0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run base64");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// An allowlisted sandbox has the relay's explicit egress proxy on its loopback port 3128.
/// Through a preview, whoever holds the preview token (handed out to show an app) would use
/// the sandbox's allowlist and its secrets: the relay refuses that port, by host name and by
/// path, whatever the request, while the sandbox's own apps stay reachable.
#[tokio::test]
async fn a_preview_never_reaches_the_sandboxs_egress_proxy() {
    let relay = Relay::start();
    let id = relay.create(&["--allow-host", "example.com"]);
    let client = relay.client();
    let s = client.connect(&id).await.unwrap();
    servers::http_site(&s, 8000, PAGE).await;
    let preview = client.preview(&id).await.unwrap();
    let addr = relay.url.trim_start_matches("http://");
    let port = addr.rsplit(':').next().unwrap();
    let token = [("X-Tether-Preview-Token", preview.token.as_str())];

    // The proxy is there: the sandbox's own programs use it.
    let inside = relay.sh(
        &id,
        "python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', 3128)); \
         s.sendall(b'CONNECT x.invalid:443 HTTP/1.1\\r\\n\\r\\n'); print(s.recv(12).decode())\"",
    );
    assert!(
        String::from_utf8_lossy(&inside.stdout).starts_with("HTTP/1.1 403"),
        "no egress proxy on 3128 inside: {inside:?}"
    );

    let by_host = format!("3128-{id}.localhost:{port}");
    let by_path = format!("/preview/{id}/3128/");
    // The path form with the Host of an allowlisted site is what the proxy would have sent on
    // to that site, secrets injected.
    for (host, path) in [
        (by_host.as_str(), "/"),
        (addr, by_path.as_str()),
        ("example.com", by_path.as_str()),
    ] {
        for target in [path.to_string(), format!("{path}http://example.com/")] {
            let answer = servers::get(addr, host, &target, &token).await;
            assert_eq!(answer.status, 403, "{host}{target}: {answer:?}");
            assert!(answer.body.contains("egress proxy"), "{answer:?}");
        }
    }
    // A wrong token learns nothing new: the same 401 as anywhere else.
    let wrong = servers::get(addr, &by_host, "/", &[("X-Tether-Preview-Token", "00")]).await;
    assert_eq!(wrong.status, 401, "{wrong:?}");
    // The app beside it is served.
    let page = servers::get(addr, &format!("8000-{id}.localhost:{port}"), "/", &token).await;
    assert_eq!((page.status, page.body.as_str()), (200, PAGE));
}
