//! The fake addresses a sandbox's DNS lookups get: each allowed name receives its own address
//! from 198.18.0.0/15 (reserved for benchmarking, so never a real destination), and the proxy
//! maps a connection's destination back to the name. The map is written through to a file in
//! the relay's data directory, so a restarted relay still knows the addresses programs inside
//! have cached.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ipnet::Ipv4Net;

use super::constants::MAX_FAKE_NAMES;

/// The network fake addresses come from.
pub(super) const FAKE_NETWORK: Ipv4Net = match Ipv4Net::new(Ipv4Addr::new(198, 18, 0, 0), 15) {
    Ok(net) => net,
    Err(_) => panic!("198.18.0.0/15 is a valid network"),
};

/// One sandbox's names and their fake addresses.
#[derive(Debug)]
pub(super) struct FakePool {
    inner: Mutex<Names>,
    file: PathBuf,
}

#[derive(Debug, Default)]
struct Names {
    by_name: HashMap<String, Ipv4Addr>,
    by_addr: HashMap<Ipv4Addr, String>,
    /// The next address to give out.
    next: u32,
}

/// The pool holds [`MAX_FAKE_NAMES`] names already.
#[derive(Debug, thiserror::Error)]
#[error("the sandbox looked up {MAX_FAKE_NAMES} different names; no fake address is left")]
pub(super) struct PoolFull;

impl FakePool {
    /// The pool kept in `file`, with what an earlier relay wrote there (a missing file is an
    /// empty pool; lines that do not parse are skipped).
    pub(super) fn open(file: &Path) -> Self {
        let mut names = Names::default();
        if let Ok(existing) = File::open(file) {
            for line in BufReader::new(existing).lines().map_while(Result::ok) {
                let Some((addr, name)) = line.split_once(' ') else {
                    continue;
                };
                let Ok(addr) = addr.parse::<Ipv4Addr>() else {
                    continue;
                };
                if FAKE_NETWORK.contains(&addr) && names.by_addr.len() < MAX_FAKE_NAMES {
                    names.by_name.insert(name.to_string(), addr);
                    names.by_addr.insert(addr, name.to_string());
                    names.next = names.next.max(u32::from(addr) + 1);
                }
            }
        }
        FakePool {
            inner: Mutex::new(names),
            file: file.to_path_buf(),
        }
    }

    /// The address of `name` (lowercase, no trailing dot), given out now if it had none.
    pub(super) fn assign(&self, name: &str) -> Result<Ipv4Addr, PoolFull> {
        let mut names = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(addr) = names.by_name.get(name) {
            return Ok(*addr);
        }
        if names.by_addr.len() >= MAX_FAKE_NAMES {
            return Err(PoolFull);
        }
        // Addresses are handed out in order, skipping the network's first (its own address);
        // MAX_FAKE_NAMES is below the network's size, so this stays inside it.
        let first = u32::from(FAKE_NETWORK.network()) + 1;
        let addr = Ipv4Addr::from(names.next.max(first));
        names.next = u32::from(addr) + 1;
        names.by_name.insert(name.to_string(), addr);
        names.by_addr.insert(addr, name.to_string());
        // Best effort: a lost line costs only a cached address after a relay restart.
        if let Err(e) = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.file)
            .and_then(|mut f| f.write_all(format!("{addr} {name}\n").as_bytes()))
        {
            tracing::warn!(
                "cannot record a fake address in {}: {e}",
                self.file.display()
            );
        }
        Ok(addr)
    }

    /// The name `addr` was given to, if any.
    pub(super) fn name_of(&self, addr: Ipv4Addr) -> Option<String> {
        let names = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        names.by_addr.get(&addr).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_their_address_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("names");
        let pool = FakePool::open(&file);
        let a = pool.assign("api.allowed.test").unwrap();
        let b = pool.assign("files.allowed.test").unwrap();
        assert_ne!(a, b);
        assert_eq!(pool.assign("api.allowed.test").unwrap(), a);
        assert!(FAKE_NETWORK.contains(&a) && FAKE_NETWORK.contains(&b));
        assert_eq!(pool.name_of(b).as_deref(), Some("files.allowed.test"));
        assert_eq!(pool.name_of(Ipv4Addr::new(198, 18, 9, 9)), None);

        let again = FakePool::open(&file);
        assert_eq!(again.name_of(a).as_deref(), Some("api.allowed.test"));
        assert_eq!(again.assign("files.allowed.test").unwrap(), b);
    }
}
