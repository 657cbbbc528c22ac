//! `info`: facts about the agent and the machine it runs on.

use tether_proto::op::{AgentInfo, Reply};

use crate::agent::Agent;
use crate::stream::{OpResult, StreamCtx};
use crate::users;

/// Replies with [`AgentInfo`].
pub(crate) async fn run(ctx: StreamCtx, agent: &Agent) -> OpResult {
    ctx.out.reply(Reply::Info(collect(agent))).await
}

/// Gathers the facts; cheap enough to call per request.
pub(crate) fn collect(agent: &Agent) -> AgentInfo {
    let uts = nix::sys::utsname::uname().ok();
    let field = |f: fn(&nix::sys::utsname::UtsName) -> &std::ffi::OsStr| {
        uts.as_ref()
            .map(|u| f(u).to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let uid = nix::unistd::getuid().as_raw();
    let account = users::by_uid(uid);
    AgentInfo {
        agent_version: tether_proto::TETHER_VERSION.to_string(),
        os: format!("{} {}", field(|u| u.sysname()), field(|u| u.release())),
        arch: std::env::consts::ARCH.to_string(),
        user: account
            .as_ref()
            .map(|a| a.name.clone())
            .unwrap_or_else(|| uid.to_string()),
        home: std::env::var("HOME")
            .ok()
            .or_else(|| account.map(|a| a.home.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "/".into()),
        cwd: agent.workdir.to_string_lossy().into_owned(),
        hostname: field(|u| u.nodename()),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        memory_bytes: memory_bytes(),
        pid: std::process::id(),
    }
}

/// Total memory, or the cgroup's limit when that is lower.
fn memory_bytes() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0);
    let limit = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok());
    match limit {
        Some(l) if l > 0 && l < total => l,
        _ => total,
    }
}
