//! Support for the image tests: Debian's static busybox as a base root file system, the static
//! agent (built once when missing), `tether image` runs, and a real registry (Debian's
//! docker-registry) on an ephemeral loopback port.
//!
//! Needs the Debian packages skopeo, umoci, podman, runc, docker-registry and busybox-static.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::bin;

/// How long a registry or a container may take to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Where cargo puts the static agent, under the target directory.
pub(crate) const STATIC_AGENT: &str = "x86_64-unknown-linux-musl/release/tether-agent";
/// Busybox applets linked in the test base.
pub(crate) const APPLETS: [&str; 5] = ["sh", "ls", "cat", "echo", "uname"];

/// The static agent, built once if missing (CI builds it before the tests).
pub fn static_agent() -> &'static Path {
    static AGENT: OnceLock<PathBuf> = OnceLock::new();
    AGENT.get_or_init(|| {
        // target/debug/deps/image-… → target/
        let exe = std::env::current_exe().expect("test executable path");
        let target = exe.ancestors().nth(3).expect("target directory");
        let path = target.join(STATIC_AGENT);
        if !path.exists() {
            crate::require::musl_target();
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("workspace");
            let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .args([
                    "build",
                    "--release",
                    "--target",
                    "x86_64-unknown-linux-musl",
                    "-p",
                    "tether-agent",
                ])
                .env("CARGO_TARGET_DIR", target)
                .current_dir(workspace)
                .status()
                .expect("run cargo to build the static agent");
            assert!(status.success(), "building the static agent failed");
        }
        path
    })
}

/// A command for a Debian tool; fails the test, saying what installs it, when it is missing.
#[track_caller]
pub fn tool(name: &str) -> Command {
    crate::require::command(name)
}

/// Runs `cmd`, asserts success, returns stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// `tether image ARGS` (no relay involved).
pub fn image_cmd(args: &[&str]) -> Output {
    Command::new(bin("tether"))
        .arg("image")
        .args(args)
        .env_remove("SOURCE_DATE_EPOCH")
        .output()
        .expect("run tether image")
}

/// A root filesystem with Debian's static busybox as `/bin/busybox` and a few applets.
pub fn busybox_rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("busybox-root");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    std::fs::copy(crate::require::static_busybox(), root.join("bin/busybox"))
        .expect("copy /bin/busybox");
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    root
}

/// Builds `base` plus the agent into `output`; returns the digest printed.
pub fn build(base: &Path, output: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "build",
        "--base",
        base.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ];
    args.extend(["--agent", static_agent().to_str().unwrap()]);
    args.extend(extra);
    let out = image_cmd(&args);
    assert!(
        out.status.success(),
        "tether image {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A busybox image built in a fresh directory.
pub struct Built {
    pub dir: tempfile::TempDir,
    pub layout: PathBuf,
    pub digest: String,
}

pub fn busybox_image() -> Built {
    let dir = tempfile::tempdir().unwrap();
    let root = busybox_rootfs(dir.path());
    let layout = dir.path().join("image");
    let digest = build(&root, &layout, &[]);
    Built {
        dir,
        layout,
        digest,
    }
}

/// A real registry (Debian's docker-registry) on an ephemeral loopback port, with its
/// storage in a temporary directory; stopped on drop.
pub struct RegistryServer {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl RegistryServer {
    pub fn start() -> RegistryServer {
        RegistryServer::start_with(None)
    }

    /// With `htpasswd` (a line `user:bcrypt-hash`), the registry asks for basic auth.
    pub fn start_with(htpasswd: Option<&str>) -> RegistryServer {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.yml");
        let storage = dir.path().join("storage");
        let mut yaml = format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:0\n",
            storage.display()
        );
        if let Some(line) = htpasswd {
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, format!("{line}\n")).unwrap();
            yaml.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: tether-test\n    path: {}\n",
                file.display()
            ));
        }
        std::fs::write(&config, yaml).unwrap();
        let mut child = tool("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start docker-registry");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let (false, Some(at)) = (sent, line.find("listening on ")) {
                    let addr = line[at + "listening on ".len()..]
                        .split(['"', ' '])
                        .next()
                        .unwrap_or("")
                        .to_string();
                    let _ = tx.send(addr);
                    sent = true;
                }
            }
        });
        let addr = match rx.recv_timeout(READY_TIMEOUT) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!("docker-registry did not say where it listens within {READY_TIMEOUT:?}");
            }
        };
        RegistryServer {
            child,
            addr,
            _dir: dir,
        }
    }
}

impl Drop for RegistryServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
