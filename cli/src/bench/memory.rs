//! Resident memory of the processes under test: the relay (found by its listening port when
//! the bench did not start it), and the agent (read inside its sandbox, through an exec, so
//! it works for any sandbox whatever runs it).

use std::collections::HashSet;

use anyhow::Context;
use tether_proto::op::ExecSpec;

use tether_client::Session;

/// Resident memory of process `pid` on this machine, in bytes.
pub(super) fn rss(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read the status of process {pid}"))?;
    vm_rss(&status).with_context(|| format!("process {pid} reports no VmRSS"))
}

/// Resident memory of the agent behind `session`, in bytes.
pub(super) async fn agent_rss(session: &Session) -> anyhow::Result<u64> {
    let pid = session.info().await?.pid;
    let path = format!("/proc/{pid}/status");
    let out = session
        .exec(ExecSpec::argv(["cat", path.as_str()]))
        .await?
        .output()
        .await?;
    vm_rss(&String::from_utf8_lossy(&out.stdout))
        .with_context(|| format!("cannot read the agent's VmRSS from {path} in the sandbox"))
}

/// The `VmRSS` of a `/proc/PID/status` text, in bytes.
fn vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The process listening on the port of `url` (`http://host:port`) when the host is this
/// machine's loopback; `None` otherwise, or when it cannot be seen (another user's process).
pub(super) fn loopback_listener(url: &str) -> Option<u32> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next()?;
    let (host, port) = authority.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if !matches!(host, "127.0.0.1" | "localhost" | "::1") {
        return None;
    }
    let port: u16 = port.parse().ok()?;
    let mut inodes = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            inodes.extend(listening_inodes(&text, port));
        }
    }
    if inodes.is_empty() {
        return None;
    }
    let wanted: HashSet<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if wanted.contains(target.to_string_lossy().as_ref()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// The inodes of sockets listening on `port` in a `/proc/net/tcp` table.
fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    const LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = fields.get(1)?;
            let local_port = u16::from_str_radix(local.rsplit_once(':')?.1, 16).ok()?;
            (local_port == port && *fields.get(3)? == LISTEN)
                .then(|| fields.get(9)?.parse().ok())
                .flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vm_rss_in_bytes() {
        let status = "Name:\tcat\nVmPeak:\t  9000 kB\nVmRSS:\t    1234 kB\nThreads:\t1\n";
        assert_eq!(vm_rss(status), Some(1234 * 1024));
        assert_eq!(vm_rss("Name:\tx\n"), None);
    }

    #[test]
    fn finds_listening_sockets_by_port() {
        let table = concat!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  ",
            "timeout inode\n",
            "   0: 0100007F:1CFC 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0 ",
            "       0 4242 1 0000000000000000 100 0 0 10 0\n",
            "   1: 0100007F:1CFC 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0 ",
            "       0 4343 1 0000000000000000 20 4 30 10 -1\n",
        );
        assert_eq!(listening_inodes(table, 7420), vec![4242]);
        assert!(listening_inodes(table, 80).is_empty());
    }

    #[test]
    fn finds_our_own_listener() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        assert_eq!(loopback_listener(&url), Some(std::process::id()));
        assert_eq!(loopback_listener("http://example.com:80"), None);
        assert!(rss(std::process::id()).unwrap() > 0);
    }
}
