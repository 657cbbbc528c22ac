//! Faults between the real binaries: connections black-holed by a loopback proxy the test
//! controls (packets vanish, sockets stay open), floods of half-open HTTP requests, and a
//! sandbox that exhausts descriptors through port tunnels. Each asserts a bounded time to a
//! clear error and what survives.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tether_client::{Process, ProcessEvent, RelayClient};
use tether_e2e::{eventually, wait_within, Relay};
use tether_proto::op::ExecSpec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// The peer timeout the tests configure: short, so a test takes seconds.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);
/// What a bounded wait allows beyond the timeout it checks: ping periods, scheduling on a
/// busy machine.
const SLACK: Duration = Duration::from_secs(4);

/// What the proxy does with the bytes of its connections.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// Pass them on.
    Forward,
    /// Swallow them in both directions, keeping every socket open: a network that drops
    /// packets silently.
    BlackHole,
}

/// A loopback TCP proxy to `upstream`, on a runtime of its own so tests may block.
struct Proxy {
    addr: SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> Proxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (mode, _) = watch::channel(Mode::Forward);
        let mode = Arc::new(mode);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let modes = mode.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let accept = async {
                    loop {
                        let Ok((client, _)) = listener.accept().await else {
                            continue;
                        };
                        let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                            continue;
                        };
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        tokio::spawn(carry(cr, sw, modes.subscribe()));
                        tokio::spawn(carry(sr, cw, modes.subscribe()));
                    }
                };
                tokio::select! {
                    () = accept => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime closes every socket the proxy holds.
        });
        Proxy {
            addr,
            mode,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Moves bytes from `from` to `to` while the mode says so, swallowing them otherwise.
async fn carry(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if *mode.borrow() == Mode::Forward && to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    // In a black hole not even the end of a connection gets through.
    if *mode.borrow() == Mode::Forward {
        let _ = to.shutdown().await;
    } else {
        std::future::pending::<()>().await;
    }
}

/// The relay's address.
fn addr_of(relay: &Relay) -> SocketAddr {
    relay.url.strip_prefix("http://").unwrap().parse().unwrap()
}

/// Whether process `pid` (a pid inside the sandbox) is alive, asked straight of the relay.
fn alive(relay: &Relay, id: &str, pid: u32) -> bool {
    relay.sh(id, &format!("kill -0 {pid}")).status.success()
}

/// Starts `script` (which must print its pid first) on `session`; returns it and the pid.
async fn started(session: &tether_client::Session, spec: ExecSpec) -> (Process, u32) {
    let mut process = session.exec(spec).await.unwrap();
    let mut out = Vec::new();
    while !out.contains(&b'\n') {
        match tokio::time::timeout(Duration::from_secs(30), process.next()).await {
            Ok(Some(Ok(ProcessEvent::Stdout(b)))) => out.extend_from_slice(&b),
            Ok(Some(Ok(_))) => {}
            other => panic!("no pid from the process: {other:?}"),
        }
    }
    let pid = String::from_utf8(out).unwrap().trim().parse().unwrap();
    (process, pid)
}

#[tokio::test]
async fn a_black_holed_exec_exits_within_the_peer_timeout_and_its_process_is_killed() {
    let relay = Relay::start_with(&["--peer-timeout", "2s"]);
    let id = relay.create(&[]);
    let proxy = Proxy::start(addr_of(&relay));
    let mut child = relay
        .tether()
        .env("TETHER_RELAY", proxy.url())
        .env("TETHER_PEER_TIMEOUT", "2s")
        .args(["exec", &id, "--", "sh", "-c", "echo $$; exec sleep 600"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid: u32 = line.trim().parse().expect("the remote pid");

    proxy.set(Mode::BlackHole);
    let cut = Instant::now();
    let status = wait_within(
        &mut child,
        PEER_TIMEOUT + SLACK,
        "the black-holed tether exec",
    );
    let waited = cut.elapsed();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        waited >= PEER_TIMEOUT / 2,
        "gave up after {waited:?}: {stderr}"
    );
    // 125: `tether` itself failed, not the remote command (which would be 0-124 or 128+).
    assert_eq!(status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("went silent")
            && stderr.contains("nothing arrived for 2s (the peer timeout, TETHER_PEER_TIMEOUT)"),
        "{stderr}"
    );

    // The relay heard nothing from the client either, and ended its session as on a
    // disconnect: the foreground process is killed.
    eventually(
        PEER_TIMEOUT + SLACK,
        "the foreground process killed",
        || (!alive(&relay, &id, pid)).then_some(()),
    )
    .await;
}

#[tokio::test]
async fn the_relay_drops_a_black_holed_client_killing_foreground_work_and_keeping_background() {
    let relay = Relay::start_with(&["--peer-timeout", "2s"]);
    let id = relay.create(&[]);
    let proxy = Proxy::start(addr_of(&relay));
    // The client's own timeout is the default 30 s: only the relay can notice in time.
    let through_proxy = RelayClient::new(&proxy.url(), Some(relay.admin_token.clone())).unwrap();
    let session = through_proxy.connect(&id).await.unwrap();
    let mut spec = ExecSpec::shell("echo $$; exec sleep 600");
    spec.background = true;
    let (background, bg_pid) = started(&session, spec).await;
    let (_foreground, fg_pid) = started(&session, ExecSpec::shell("echo $$; exec sleep 600")).await;

    proxy.set(Mode::BlackHole);
    let cut = Instant::now();
    eventually(
        PEER_TIMEOUT + SLACK,
        "the foreground process killed",
        || (!alive(&relay, &id, fg_pid)).then_some(()),
    )
    .await;
    assert!(cut.elapsed() >= PEER_TIMEOUT / 2, "{:?}", cut.elapsed());
    assert!(
        alive(&relay, &id, bg_pid),
        "the background process was killed"
    );

    // ... and can be re-attached from a new connection.
    let direct = relay.client().connect(&id).await.unwrap();
    let again = direct
        .attach(background.process, background.offsets(), false)
        .await
        .expect("the background process re-attaches");
    assert_eq!(again.pid, background.pid);
    direct.kill(background.process, None, true).await.unwrap();
}

/// Sends the start of a request and nothing more.
fn half_open(addr: SocketAddr) -> Option<TcpStream> {
    let mut tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    tcp.write_all(b"GET /v1/health HTTP/1.1\r\nHost: relay\r\n")
        .ok()?;
    Some(tcp)
}

/// `GET /v1/health` within `limit`: the status line, or why there is none.
fn health(addr: SocketAddr, limit: Duration) -> Result<String, String> {
    let mut tcp = TcpStream::connect_timeout(&addr, limit).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(limit)).unwrap();
    tcp.write_all(b"GET /v1/health HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    Ok(answer.lines().next().unwrap_or_default().to_string())
}

#[test]
fn health_answers_through_a_flood_of_half_open_requests() {
    // The default descriptor limit of many systems: 1,100 idle connections would take all.
    let relay = Relay::start_with_nofile(1024);
    let addr = addr_of(&relay);
    let slow: Vec<TcpStream> = (0..1100).filter_map(|_| half_open(addr)).collect();
    assert!(slow.len() > 1000, "only {} connections opened", slow.len());
    let asked = Instant::now();
    let answer = health(addr, Duration::from_secs(5));
    assert_eq!(
        answer.as_deref(),
        Ok("HTTP/1.1 200 OK"),
        "after {:?}",
        asked.elapsed()
    );
    drop(slow);
}

#[test]
fn a_request_head_that_does_not_arrive_in_time_closes_its_connection() {
    let relay = Relay::start_with(&["--header-timeout", "2s"]);
    let addr = addr_of(&relay);
    let mut slow = half_open(addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(2) + SLACK))
        .unwrap();
    let opened = Instant::now();
    let mut rest = Vec::new();
    // The relay closes the connection (a 408 first, at most); a read timeout here fails.
    slow.read_to_end(&mut rest)
        .expect("the relay closed the connection");
    assert!(
        opened.elapsed() >= Duration::from_secs(1),
        "{:?}",
        opened.elapsed()
    );
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.is_empty() || rest.starts_with("HTTP/1.1 408"),
        "{rest}"
    );
    // Meanwhile, and after, the relay serves.
    assert_eq!(
        health(addr, Duration::from_secs(5)).as_deref(),
        Ok("HTTP/1.1 200 OK")
    );
}

/// A server inside the sandbox that accepts connections on `port` and holds them, and when it
/// runs out of descriptors itself stops accepting (its backlog still completes connects).
const HOLDING_SERVER: &str = "
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', int(sys.argv[1])))
s.listen(4096)
held = []
while True:
    try:
        held.append(s.accept()[0])
    except OSError:
        break
time.sleep(3600)
";

#[tokio::test]
async fn a_sandbox_exhausting_descriptors_through_port_tunnels_keeps_its_agent() {
    // The agent inherits the relay's limit: 1,100 tunnels are more than it has descriptors.
    let relay = Relay::start_with_nofile(1024);
    let id = relay.create(&[]);
    let client = relay.client();
    let session = client.connect(&id).await.unwrap();
    crate::servers::start(&session, &["python3", "-c", HOLDING_SERVER, "8100"], 8100).await;

    // Opened in batches, each followed by a short look for refusals: a refused stream gets
    // its error at once, one let through stays silent until its server speaks.
    let mut tunnels = Vec::new();
    let mut refused = None;
    while refused.is_none() && tunnels.len() < 1100 {
        let mut batch = Vec::new();
        for _ in 0..50 {
            batch.push(session.connect_port(8100).await.unwrap());
        }
        let looks = batch
            .iter_mut()
            .map(|s| tokio::time::timeout(Duration::from_millis(100), s.next()));
        for look in futures_util::future::join_all(looks).await {
            match look {
                Err(_) => {}
                Ok(Some(tether_client::Event::Error(e))) => {
                    refused.get_or_insert(e);
                }
                Ok(other) => panic!("unexpected event on a tunnel: {other:?}"),
            }
        }
        tunnels.extend(batch);
    }
    let refused = refused.expect("1,100 tunnels were all let through");
    assert_eq!(
        refused.code(),
        Some(tether_proto::ErrorCode::TooLarge),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("port tunnels open")
            && refused.to_string().contains("descriptors"),
        "{refused}"
    );
    assert!(
        tunnels.len() >= 100,
        "refused after {} tunnels",
        tunnels.len()
    );

    // The agent lives, on this connection and on new ones, and the relay still serves it.
    let out = session
        .exec(ExecSpec::argv(["echo", "alive"]))
        .await
        .unwrap()
        .output()
        .await
        .unwrap();
    assert_eq!(out.stdout, b"alive\n");
    let out = relay.sh(&id, "echo still");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"still\n");
    let listed = relay.tether().args(["ls", "--json"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("\"running\""),
        "{listed:?}"
    );

    // Closing tunnels gives their descriptors back: new ones are let through again.
    drop(tunnels);
    let fresh = client.connect(&id).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut again = fresh.connect_port(8100).await.unwrap();
        match tokio::time::timeout(Duration::from_millis(500), again.next()).await {
            Err(_) => break,
            Ok(event) => assert!(
                Instant::now() < deadline,
                "no tunnel let through after the others closed: {event:?}"
            ),
        }
    }
}

#[test]
fn a_relay_whose_disk_fills_keeps_serving_its_sandboxes_and_loses_none() {
    // The relay's data directory (its database, its sandboxes' disks) on a small disk of the
    // test's own, which then fills up.
    let disk = tether_e2e::Tmpfs::mount("96m");
    let data_dir = disk.path().join("data");
    std::fs::create_dir(&data_dir).unwrap();
    let relay = Relay::start_on(&data_dir);
    // Idle out after 4 s without a client: the activity below, though the relay cannot record
    // it, must keep it.
    let id = relay.create(&["--idle-timeout", "4s"]);
    let filler = disk.fill("filler");

    // A full disk fails nothing of a running sandbox: the relay's own records are what
    // cannot be written. Sessions through the relay go on for longer than the idle timeout.
    let full_since = Instant::now();
    while full_since.elapsed() < Duration::from_secs(6) {
        let out = relay.sh(&id, "echo alive");
        assert!(out.status.success(), "{out:?}");
        assert_eq!(out.stdout, b"alive\n");
        std::thread::sleep(Duration::from_millis(500));
    }

    // What needs the disk is refused at once, saying why and what to do.
    let asked = Instant::now();
    let out = relay.tether().args(["create"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "created on a full disk: {out:?}");
    assert!(
        said.contains("full") || said.contains("No space left on device"),
        "{said}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(30),
        "{:?}",
        asked.elapsed()
    );

    // Space comes back. The reaper, able to write again, must not take the activity it could
    // not record for idleness: the sandbox is still there after several of its ticks.
    std::fs::remove_file(&filler).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let listed = relay.tether().args(["ls", "--json"]).output().unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains(&id) && listed.contains("\"running\""),
        "{listed}"
    );
    let out = relay.sh(&id, "echo back");
    assert_eq!(out.stdout, b"back\n", "{out:?}");
    // And creating works again.
    let other = relay.create(&[]);
    assert_eq!(relay.sh(&other, "echo new").stdout, b"new\n");
}

#[test]
fn a_relay_started_on_a_full_disk_says_so_and_leaves_nothing_that_stops_the_next_start() {
    // With no space at all, a few KiB (its id and key files fit, its database does not), and a
    // few hundred: each first start fails naming the disk, or runs; either way, once space is
    // back, a relay starts on the same directory. A file left empty or half written (an id,
    // a key) would be read as damaged there.
    for free_kib in [0_u64, 4, 8, 16, 64, 192] {
        let disk = tether_e2e::Tmpfs::mount("16m");
        let data_dir = disk.path().join("data");
        std::fs::create_dir(&data_dir).unwrap();
        let filler = disk.fill_leaving("filler", free_kib << 10);
        let mut first = std::process::Command::new(tether_e2e::bin("tether"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data_dir)
            .env("TETHER_AGENT_BIN", tether_e2e::bin("tether-agent"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let exited = loop {
            if let Some(status) = first.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        match exited {
            Some(status) => {
                let mut said = String::new();
                first
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut said)
                    .unwrap();
                assert!(!status.success(), "{free_kib} KiB free: {said}");
                assert!(
                    said.contains("No space left on device")
                        || said.contains("disk is full")
                        || said.contains("disk I/O error"),
                    "{free_kib} KiB free: {said}"
                );
                assert!(
                    said.contains("free space") || said.contains("No space"),
                    "{said}"
                );
            }
            // It fitted: the relay runs.
            None => {
                first.kill().unwrap();
                first.wait().unwrap();
            }
        }
        std::fs::remove_file(&filler).unwrap();
        let relay = Relay::start_on(&data_dir);
        let listed = relay.tether().arg("ls").output().unwrap();
        assert!(listed.status.success(), "{free_kib} KiB free: {listed:?}");
    }
}
