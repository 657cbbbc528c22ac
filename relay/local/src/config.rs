//! The contract between the relay and the sandbox init it starts: the [`InitConfig`] the relay
//! writes as JSON on the init's stdin (stdin, so the agent token never touches the disk), and
//! the [`Report`] lines the init writes back on its status pipe (its original stdout).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::constants::MAX_REPORT_LEN;
use super::constants::{STAGED_AGENT, STAGED_LOWER};
use super::layout::Layout;
use super::plan::Rootfs;
use tether_relay_core::provider::NetworkPolicy;

/// Everything the sandbox init needs to build one sandbox and start its agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct InitConfig {
    /// The sandbox id, also its hostname.
    pub id: String,
    /// The sandbox's host directories.
    pub layout: Layout,
    /// What `/` is made of.
    pub rootfs: Rootfs,
    /// The agent binary on the host, bound read-only into the sandbox.
    pub agent_binary: PathBuf,
    /// Loopback only, or the host's network.
    pub network: NetworkPolicy,
    /// The `cgroup.procs` files to join before anything else.
    pub cgroup_procs: Vec<PathBuf>,
    /// How the sandbox's users map to the host's: always a user namespace of its own.
    pub users: IdMapping,
    /// Run without the seccomp filter (an admin's choice for one sandbox).
    #[serde(default)]
    pub seccomp_unconfined: bool,
    /// The agent's complete environment, `KEY=VALUE`.
    pub env: Vec<String>,
    /// Arguments after the agent's fixed ones: an image's working directory and user.
    #[serde(default)]
    pub agent_args: Vec<String>,
    /// Install the sandbox's egress CA (`Layout::egress_ca`, `Layout::ca_bundle`; see `trust`).
    #[serde(default)]
    pub trust_egress_ca: bool,
}

impl InitConfig {
    /// The configuration as PID 1 of a root relay's sandbox uses it: it starts in the sandbox's
    /// directory and finds its parts there by relative paths, the agent and the image staged
    /// by the init (see `stage`).
    pub(super) fn staged(mut self) -> Self {
        self.layout = Layout::here();
        if let Rootfs::Image(lower) = &mut self.rootfs {
            *lower = STAGED_LOWER.into();
        }
        self.agent_binary = STAGED_AGENT.into();
        self
    }
}

/// How a sandbox's user namespace maps ids to the host's. Root inside is never root outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mapping", rename_all = "snake_case")]
pub(super) enum IdMapping {
    /// A relay that is not root can map only itself: its uid and gid become root inside, and
    /// no other id exists there.
    Own {
        /// Host uid.
        uid: u32,
        /// Host gid.
        gid: u32,
    },
    /// A root relay maps the sandbox's ids `0..count` to the unprivileged host ids
    /// `base..base + count`, and makes the namespace's owner `owner`, a host uid of this
    /// sandbox alone, so per-user kernel limits (inotify instances and watches, user
    /// namespaces, keys) are counted per sandbox rather than against host root.
    Range {
        /// The host uid (and gid) that is root inside.
        base: u32,
        /// How many ids are mapped.
        count: u32,
        /// The host uid that owns the namespace.
        owner: u32,
    },
}

impl IdMapping {
    /// The host uid and gid that are root inside the sandbox: the owner of what it writes.
    pub(super) fn root_on_host(&self) -> (u32, u32) {
        match *self {
            IdMapping::Own { uid, gid } => (uid, gid),
            IdMapping::Range { base, .. } => (base, base),
        }
    }
}

/// One line on the status pipe. The monitor reports `Started` after forking the sandbox's
/// first process; that process reports `Failed` if a step fails and otherwise nothing: the
/// pipe closes on exec, which is how the relay learns the agent is starting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "report", rename_all = "snake_case")]
pub(super) enum Report {
    /// The sandbox's first process exists.
    Started {
        /// Its pid on the host.
        pid: i32,
        /// Its start time, to recognise it later (see `ProcessIdentity`).
        start_time: u64,
    },
    /// A step failed; the sandbox is not usable.
    Failed {
        /// What failed and what to do about it.
        message: String,
        /// The host cannot run sandboxes at all (missing privilege or kernel feature).
        unavailable: bool,
    },
}

impl Report {
    /// The report as one newline-terminated line, short enough to be written atomically.
    pub(super) fn to_line(&self) -> Vec<u8> {
        let mut report = self.clone();
        if let Report::Failed { message, .. } = &mut report {
            if message.len() > MAX_REPORT_LEN {
                let mut cut = MAX_REPORT_LEN;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message.truncate(cut);
            }
        }
        let mut line = serde_json::to_vec(&report).unwrap_or_default();
        line.push(b'\n');
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips() {
        let config = InitConfig {
            id: "sb-1".into(),
            layout: Layout::new("/data".as_ref(), "sb-1"),
            rootfs: Rootfs::Image("/images/alpine".into()),
            agent_binary: "/usr/bin/tether-agent".into(),
            network: NetworkPolicy::Host,
            cgroup_procs: vec!["/sys/fs/cgroup/tether/sb-1/cgroup.procs".into()],
            users: IdMapping::Range {
                base: 2_000_000_000,
                count: 65536,
                owner: 2_000_070_000,
            },
            seccomp_unconfined: false,
            agent_args: vec!["--workdir".into(), "/srv".into()],
            env: vec!["A=B".into()],
            trust_egress_ca: true,
        };
        let json = serde_json::to_string(&config).unwrap();
        assert_eq!(serde_json::from_str::<InitConfig>(&json).unwrap(), config);
    }

    #[test]
    fn reports_are_single_bounded_lines() {
        let long = Report::Failed {
            message: "é".repeat(MAX_REPORT_LEN),
            unavailable: true,
        };
        let line = long.to_line();
        assert!(line.len() < 4096);
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        let back: Report = serde_json::from_slice(&line).unwrap();
        assert!(matches!(
            back,
            Report::Failed {
                unavailable: true,
                ..
            }
        ));

        let started = Report::Started {
            pid: 7,
            start_time: 9,
        };
        assert_eq!(
            serde_json::from_slice::<Report>(&started.to_line()).unwrap(),
            started
        );
    }
}
