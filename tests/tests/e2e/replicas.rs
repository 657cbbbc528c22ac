//! Relays as replicas: a private PostgreSQL server and three real relays on loopback, each
//! with a data directory of its own (so each owns the local sandboxes it creates, and reaches
//! the others' only through their relays), sharing one key file.

use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use tether_client::RelayClient;
use tether_e2e::postgres::PgServer;
use tether_e2e::{eventually, require, sha256_hex, Relay};
use tether_proto::op::ExecSpec;

/// How long the cluster may take to notice a change (a relay down, a lease taken over).
const SETTLE: Duration = Duration::from_secs(45);

/// A PostgreSQL server and relays sharing it.
struct Cluster {
    // Dropped before the server, which they need to clean up.
    relays: Vec<Relay>,
    pg: PgServer,
    db: String,
    key: PathBuf,
    _key_dir: tempfile::TempDir,
}

impl Cluster {
    /// `n` relays on a fresh database.
    fn start(n: usize) -> Cluster {
        require::root("local sandboxes");
        let pg = PgServer::start();
        let url = pg.fresh_database();
        let db = url.rsplit('/').next().unwrap().to_string();
        let key_dir = tempfile::tempdir().unwrap();
        let key = key_dir.path().join("relay.key");
        std::fs::write(&key, format!("{}\n", tether_e2e::token().repeat(2))).unwrap();
        let args = ["--database", &url, "--key-file", key.to_str().unwrap()];
        let relays = (0..n).map(|_| Relay::start_with(&args)).collect();
        Cluster {
            relays,
            pg,
            db,
            key,
            _key_dir: key_dir,
        }
    }

    fn relay(&self, n: usize) -> &Relay {
        &self.relays[n - 1]
    }

    /// One number from the database, behind the relays' backs.
    fn count(&self, sql: &str) -> i64 {
        self.pg.psql(&self.db, sql).parse().unwrap()
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The state `tether ls` shows for `id` through `relay`.
fn state_of(relay: &Relay, id: &str) -> String {
    let out = relay.tether().args(["ls", "--json"]).output().unwrap();
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let found = all.as_array().into_iter().flatten().find(|s| s["id"] == id);
    found
        .and_then(|s| s["state"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relays_serve_every_sandbox_and_lose_none_when_one_dies() {
    let mut cluster = Cluster::start(3);

    // Get-or-create of one label set through all three at once yields one sandbox.
    let racers: Vec<_> = (1..=3)
        .flat_map(|n| [n, n])
        .map(|n| {
            let mut cmd = cluster.relay(n).tether();
            cmd.args(["create", "--get-or-create", "--label", "race=1"]);
            std::thread::spawn(move || cmd.output().unwrap())
        })
        .collect();
    let ids: Vec<String> = racers
        .into_iter()
        .map(|r| {
            let out = r.join().unwrap();
            assert!(out.status.success(), "{}", stderr(&out));
            stdout(&out).trim().to_string()
        })
        .collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    let listed = cluster
        .relay(2)
        .tether()
        .args(["ls", "--label", "race=1", "--json"])
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    // Removed through another relay than (perhaps) its owner: the delete hops there.
    let rm = cluster
        .relay(3)
        .tether()
        .args(["rm", &ids[0]])
        .output()
        .unwrap();
    assert!(rm.status.success(), "{}", stderr(&rm));

    // Created through relay 1 (which owns it: it is on relay 1's "host"), used through 2.
    let id = cluster.relay(1).create(&[]);
    let out = cluster
        .relay(2)
        .sh(&id, "echo hello from $(hostname); exit 7");
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("hello from {id}\n"));
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i * 7 + i / 251) as u8).collect();
    std::fs::write(dir.path().join("up"), &data).unwrap();
    let up = cluster
        .relay(2)
        .tether()
        .arg("cp")
        .arg(dir.path().join("up"))
        .arg(format!("{id}:/tmp/up"))
        .output()
        .unwrap();
    assert!(up.status.success(), "{}", stderr(&up));
    let down = cluster
        .relay(3)
        .tether()
        .arg("cp")
        .arg(format!("{id}:/tmp/up"))
        .arg(dir.path().join("down"))
        .output()
        .unwrap();
    assert!(down.status.success(), "{}", stderr(&down));
    assert_eq!(
        sha256_hex(&std::fs::read(dir.path().join("down")).unwrap()),
        sha256_hex(&data)
    );

    // Paused and resumed through relays that do not own it: each hops to relay 1, which
    // does it, and every relay reads the new state from the shared database.
    let paused = cluster.relay(2).client().pause(&id).await.unwrap();
    assert_eq!(paused.state, "paused");
    let seen = cluster.relay(3).client().get(&id).await.unwrap();
    assert_eq!(seen.state, "paused");
    // Relay 1 asks its own host, which says paused too.
    let owner = cluster.relay(1).client().get(&id).await.unwrap();
    assert_eq!(owner.state, "paused");
    cluster.relay(3).client().resume(&id).await.unwrap();
    let owner = cluster.relay(1).client().get(&id).await.unwrap();
    assert_eq!(owner.state, "running");
    // Stopped and started the same way: the owner boots it again and records its new first
    // process in the shared database, through which relay 2 then reaches it.
    assert_eq!(
        cluster.relay(3).client().stop(&id).await.unwrap().state,
        "stopped"
    );
    assert_eq!(
        cluster.relay(2).client().start(&id).await.unwrap().state,
        "running"
    );
    let out = cluster.relay(2).sh(&id, "echo up again");
    assert_eq!(stdout(&out), "up again\n", "{}", stderr(&out));

    // A background process started through relay 2, which is killed mid-stream; the client
    // re-attaches through relay 3 from its offsets and gets every byte exactly once.
    let lines = 3000;
    let script = format!("i=0; while [ $i -lt {lines} ]; do i=$((i+1)); echo line-$i; [ $((i % 50)) -eq 0 ] && sleep 0.02; done");
    let expected: String = (1..=lines).map(|i| format!("line-{i}\n")).collect();
    let session = cluster.relay(2).client().connect(&id).await.unwrap();
    let mut spec = ExecSpec::shell(&script);
    spec.background = true;
    let mut process = session.exec(spec).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 2000 {
        match process.next().await.unwrap().unwrap() {
            tether_client::ProcessEvent::Stdout(bytes) => got.extend_from_slice(&bytes),
            other => panic!("unexpected {other:?}"),
        }
    }
    let (pid, offsets) = (process.process, process.offsets());
    assert!(
        got.len() < expected.len(),
        "the process finished before relay 2 was killed"
    );
    cluster.relays[1].kill();
    drop(process);
    drop(session);
    let session = cluster.relay(3).client().connect(&id).await.unwrap();
    let mut process = session.attach(pid, offsets, false).await.unwrap();
    loop {
        match process.next().await.unwrap().unwrap() {
            tether_client::ProcessEvent::Stdout(bytes) => got.extend_from_slice(&bytes),
            tether_client::ProcessEvent::Exit(status) => {
                assert_eq!(status.code, Some(0));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        String::from_utf8(got).unwrap(),
        expected,
        "bytes lost or repeated"
    );

    // The reaper deletes an expired sandbox exactly once, whichever relay holds its lease
    // (relay 2's, dead, runs out and another takes it over) and whichever owns it.
    let short = cluster.relay(3).create(&["--ttl", "2s"]);
    let client = cluster.relay(1).client();
    eventually(SETTLE, "the expired sandbox to be reaped", || {
        let gone = cluster.count(&format!(
            "SELECT count(*) FROM sandboxes WHERE id = '{short}'"
        )) == 0;
        gone.then_some(())
    })
    .await;
    let journaled = cluster.count(&format!(
        "SELECT count(*) FROM destroyed WHERE sandbox_id = '{short}' AND reason = 'ttl'"
    ));
    assert_eq!(journaled, 1, "deleted once, journaled once");
    let err = client.get(&short).await.unwrap_err().to_string();
    assert!(err.contains("deleted by the relay"), "{err}");

    // Relay 1, which owns `id`, dies: its sandbox is unavailable through the others, not
    // deleted; back, it is served again, with its files.
    cluster.relays[0].kill();
    eventually(SETTLE, "the sandbox to show as unavailable", || {
        (state_of(cluster.relay(3), &id) == "unavailable").then_some(())
    })
    .await;
    let out = cluster.relay(3).sh(&id, "true");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unavailable (not deleted) until that relay is back"),
        "{}",
        stderr(&out)
    );
    let waited = Instant::now();
    while waited.elapsed() < Duration::from_secs(3) {
        // Meanwhile the reaper, wherever it runs, leaves it alone.
        assert_eq!(
            cluster.count(&format!("SELECT count(*) FROM sandboxes WHERE id = '{id}'")),
            1
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.relays[0].restart();
    eventually(SETTLE, "the sandbox to be served again", || {
        let out = cluster.relay(3).sh(&id, "wc -c < /tmp/up");
        (out.status.success() && stdout(&out).trim() == (3 << 20).to_string()).then_some(())
    })
    .await;
    assert_eq!(state_of(cluster.relay(3), &id), "running");
    drop(client);
    let _ = &cluster.key;
}

/// A replica killed in the middle of a create. The contract: the create either registered its
/// sandbox before the relay died (listed by `tether ls`, served when its relay is back) or is
/// left journaled under that relay's node id, never both and never neither while anything of
/// it exists; the relay that began it removes what it made when it starts again. The client
/// whose request was cut is told that the relay went away mid-request and that the sandbox
/// may exist (`tether ls`), not that no relay runs there, which is what a relay that is down
/// gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_create_leaves_what_the_contract_says_and_tells_its_client() {
    let mut cluster = Cluster::start(2);
    let victim = cluster.relay(2);
    let local = victim.data_dir.join("local");
    let node = std::fs::read_to_string(victim.data_dir.join("node.id")).unwrap();
    let node = node.trim().to_string();
    let create = victim
        .tether()
        .arg("create")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Killed once the provider is making the sandbox: its directory exists.
    let id = eventually(SETTLE, "the create to be under way", || {
        let entries = std::fs::read_dir(&local).ok()?;
        entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|name| name.starts_with("sb-"))
    })
    .await;
    cluster.relays[1].kill();
    let out = create.wait_with_output().unwrap();
    assert!(
        !out.status.success(),
        "the create succeeded: {}",
        stdout(&out)
    );
    let said = stderr(&out);
    assert!(
        said.contains("went away in the middle of the request")
            && said.contains("may exist")
            && said.contains("`tether ls`"),
        "{said}"
    );
    assert!(!said.contains("no relay at"), "{said}");
    // A relay that is not there at all is told apart: nothing was asked of it.
    let down = cluster.relay(2).tether().arg("ls").output().unwrap();
    assert!(stderr(&down).contains("no relay at"), "{}", stderr(&down));

    let registered = cluster.count(&format!(
        "SELECT count(*) FROM sandboxes WHERE id = '{id}' AND node = '{node}'"
    ));
    let journaled = cluster.count(&format!(
        "SELECT count(*) FROM create_journal WHERE sandbox_id = '{id}' AND node = '{node}'"
    ));
    assert_eq!(
        registered + journaled,
        1,
        "sandbox {id}: registered {registered} times, journaled {journaled} times"
    );
    // The other replica shows exactly what is registered.
    let listed = cluster.relay(1).tether().arg("ls").output().unwrap();
    assert_eq!(stdout(&listed).contains(&id), registered == 1, "{listed:?}");

    // Back, the relay that began it finishes it before it listens: removed if it was only
    // journaled, served if it was registered.
    cluster.relays[1].restart();
    if journaled == 1 {
        assert!(
            !local.join(&id).exists(),
            "the half-made sandbox {id} is left"
        );
        assert_eq!(
            cluster.count(&format!(
                "SELECT count(*) FROM create_journal WHERE sandbox_id = '{id}'"
            )),
            0
        );
        assert_eq!(
            cluster.count(&format!("SELECT count(*) FROM sandboxes WHERE id = '{id}'")),
            0
        );
    } else {
        let out = cluster.relay(1).sh(&id, "echo alive");
        assert_eq!(stdout(&out), "alive\n", "{}", stderr(&out));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_to_relay_requests_need_a_grant_and_tenants_stay_apart() {
    let cluster = Cluster::start(2);
    let (one, two) = (cluster.relay(1), cluster.relay(2));
    let mint = |tenant: &str| {
        let out = one
            .tether()
            .args(["token", "create", "--tenant", tenant])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).trim().to_string()
    };
    let (a, b) = (mint("team-a"), mint("team-b"));
    let as_tenant = |relay: &Relay, token: &str| {
        let mut cmd = relay.tether();
        cmd.env("TETHER_TOKEN", token);
        cmd
    };
    let out = as_tenant(one, &a).arg("create").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();

    // Straight at the owner's relay-to-relay endpoints: a tenant's token, nothing, junk, and
    // a grant signed with another key are all refused, and nothing happens to the sandbox.
    let ws_url = format!(
        "{}/v1/cluster/sandboxes/{id}/ws",
        one.url.replacen("http", "ws", 1)
    );
    let forged = forged_grant(&id);
    let attempts: [(&str, Option<(&str, String)>); 4] = [
        (
            "a tenant's own token",
            Some(("authorization", format!("Bearer {a}"))),
        ),
        ("nothing", None),
        (
            "junk",
            Some(("x-tether-cluster-grant", "v1.e30.00".to_string())),
        ),
        (
            "a grant under another key",
            Some(("x-tether-cluster-grant", forged)),
        ),
    ];
    for (what, header) in &attempts {
        let headers: Vec<(&str, &str)> = header.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let path = format!("/v1/cluster/sandboxes/{id}");
        let (code, body) = tether_e2e::cloud::http(&one.url, "DELETE", &path, &headers, "");
        assert_eq!(code, 401, "delete with {what}: {body}");
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut req = ws_url.as_str().into_client_request().unwrap();
        if let Some((name, value)) = header {
            req.headers_mut().insert(*name, value.parse().unwrap());
        }
        match tokio_tungstenite::connect_async(req).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status(), 401, "session with {what}")
            }
            other => panic!(
                "a session with {what} was not refused: {:?}",
                other.map(|_| ())
            ),
        }
    }

    // Tenant b, through the other relay, cannot reach a's sandbox: not found, as if it did
    // not exist, whether it asks for a session or a delete.
    let out = as_tenant(two, &b)
        .args(["exec", &id, "--", "true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no sandbox"), "{}", stderr(&out));
    let missing = as_tenant(two, &b)
        .args(["exec", "sb-nonexistent1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        stderr(&out).replace(&id, "ID"),
        stderr(&missing).replace("sb-nonexistent1", "ID"),
        "another tenant's sandbox must look like none"
    );
    let rm = as_tenant(two, &b).args(["rm", &id]).output().unwrap();
    assert!(stderr(&rm).contains("no sandbox"), "{}", stderr(&rm));
    // Still there, and a's through either relay.
    let out = as_tenant(two, &a)
        .args(["exec", &id, "--", "echo", "still here"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "still here\n");
    let rm = as_tenant(two, &a).args(["rm", &id]).output().unwrap();
    assert!(rm.status.success(), "{}", stderr(&rm));
    let client = RelayClient::new(&one.url, Some(a.clone())).unwrap();
    assert!(client.get(&id).await.is_err());
}

/// A well-formed grant for `id` signed with a key no relay of the cluster has.
fn forged_grant(id: &str) -> String {
    use sha2::{Digest, Sha256};
    let body = serde_json::json!({
        "sandbox": id, "tenant": "team-a", "op": "delete", "from": "node-x", "to": "node-y",
        "exp_ms": 4_102_444_800_000i64, "nonce": "00"
    });
    let payload = base64_url(body.to_string().as_bytes());
    let signed = format!("v1.{payload}");
    let tag: String = Sha256::digest(format!("not-the-key{signed}"))
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{signed}.{tag}")
}

/// Unpadded URL-safe base64.
fn base64_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |n, b| (n << 8) | u32::from(*b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}
