//! `tether dev` in a real terminal (tmux): a sandbox made for the folder, the folder synced
//! into it and kept in sync while a shell runs there, and the same sandbox found again next
//! time (then deleted with `--rm`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tether_e2e::{bin, Relay};

/// How long a screen may take to show what is awaited.
const SCREEN_TIMEOUT: Duration = Duration::from_secs(30);

/// A tmux server of its own, killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(relay: &Relay, home: &Path) -> Tmux {
        tether_e2e::require::tool("tmux");
        let tmux = Tmux {
            socket: format!("tether-dev-test-{}", std::process::id()),
        };
        let status = Command::new("tmux")
            .args(["-L", &tmux.socket, "-f", "/dev/null", "new-session", "-d"])
            .args(["-x", "120", "-y", "40"])
            .args(["-e", &format!("TETHER_RELAY={}", relay.url)])
            .args(["-e", &format!("TETHER_TOKEN={}", relay.admin_token)])
            .args(["-e", &format!("TETHER_HOME={}", home.display())])
            .args(["-e", "PS1=outer$ "])
            .args(["bash", "--norc", "--noprofile"])
            .status()
            .expect("run tmux");
        assert!(status.success(), "tmux new-session failed");
        tmux
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("run tmux");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn type_line(&self, line: &str) {
        self.run(&["send-keys", "-l", line]);
        self.run(&["send-keys", "Enter"]);
    }

    /// Polls the screen until a line satisfies `check`; returns that line.
    fn wait_for(&self, what: &str, check: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + SCREEN_TIMEOUT;
        loop {
            let screen = self.run(&["capture-pane", "-p"]);
            if let Some(line) = screen.lines().find(|l| check(l)) {
                return line.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

#[test]
fn dev_syncs_a_folder_into_its_own_sandbox_and_keeps_it() {
    let relay = Relay::start();
    let (home, folder) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(folder.path().join("readme.txt"), "hello dev\n").unwrap();
    let tmux = Tmux::start(&relay, home.path());
    tmux.wait_for("the outer prompt", |l| l.starts_with("outer$"));
    let dev = format!(
        "{} dev {}",
        bin("tether").display(),
        folder.path().display()
    );

    tmux.type_line(&dev);
    let created = tmux.wait_for("the new sandbox", |l| l.starts_with("created sandbox "));
    let id = created.split_whitespace().nth(2).unwrap().to_string();
    tmux.type_line("pwd; cat readme.txt");
    tmux.wait_for("the synced file, in the shell", |l| {
        l.trim_end() == "hello dev"
    });
    tmux.wait_for("the shell in /workspace", |l| l.trim_end() == "/workspace");

    // Edited here while the shell runs there.
    std::fs::write(
        folder.path().join("later.txt"),
        "synced while in the shell\n",
    )
    .unwrap();
    let deadline = Instant::now() + SCREEN_TIMEOUT;
    for probe in 0.. {
        tmux.type_line(&format!(
            "echo probe{probe}-$(cat later.txt 2>/dev/null | tr ' ' _)"
        ));
        let line = tmux.wait_for("the probe", |l| l.starts_with(&format!("probe{probe}-")));
        if line.trim_end().ends_with("synced_while_in_the_shell") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "later.txt never reached the sandbox"
        );
    }
    tmux.type_line("exit");
    tmux.wait_for("the sandbox kept", |l| {
        l.starts_with(&format!("kept sandbox {id}"))
    });

    // Next time, the same sandbox; --rm deletes it on the way out.
    tmux.type_line(&format!("{dev} --rm"));
    tmux.wait_for("the same sandbox", |l| {
        l.starts_with(&format!("reusing sandbox {id}"))
    });
    tmux.type_line("cat later.txt");
    tmux.wait_for("the file from last time", |l| {
        l.trim_end() == "synced while in the shell"
    });
    tmux.type_line("exit");
    tmux.wait_for("the sandbox deleted", |l| {
        l.starts_with(&format!("deleted sandbox {id}"))
    });
    let left = relay.tether().args(["ls", "-q"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&left.stdout).trim().is_empty(),
        "the sandbox is gone"
    );
}
