//! Which sandboxes have a client connected right now: the reaper never idles those out, and
//! counts them as active every [`ACTIVITY_INTERVAL`](super::constants::ACTIVITY_INTERVAL).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::store::SandboxId;

/// Open tunnels per sandbox.
#[derive(Default)]
pub(super) struct Tunnels {
    open: Mutex<HashMap<SandboxId, usize>>,
}

impl Tunnels {
    /// Counts a tunnel to `id` as open until the guard drops.
    pub(super) fn open(self: &Arc<Self>, id: SandboxId) -> TunnelGuard {
        *self.lock().entry(id.clone()).or_default() += 1;
        TunnelGuard {
            tunnels: self.clone(),
            id,
        }
    }

    /// Whether any tunnel to `id` is open.
    pub(super) fn is_open(&self, id: &SandboxId) -> bool {
        self.lock().contains_key(id)
    }

    /// Every sandbox with an open tunnel.
    pub(super) fn open_ids(&self) -> Vec<SandboxId> {
        self.lock().keys().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, usize>> {
        // The map is consistent after every statement, so a poisoned lock is safe to use.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One open tunnel; dropping it closes the count.
pub(super) struct TunnelGuard {
    tunnels: Arc<Tunnels>,
    id: SandboxId,
}

impl TunnelGuard {
    /// The sandbox the tunnel goes to.
    pub(super) fn id(&self) -> &SandboxId {
        &self.id
    }
}

impl Drop for TunnelGuard {
    fn drop(&mut self) {
        let mut open = self.tunnels.lock();
        if let Some(n) = open.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_until_the_last_guard_drops() {
        let tunnels = Arc::new(Tunnels::default());
        let id = SandboxId::from("sb-x".to_string());
        let a = tunnels.open(id.clone());
        let b = tunnels.open(id.clone());
        drop(a);
        assert!(tunnels.is_open(&id));
        assert_eq!(tunnels.open_ids(), vec![id.clone()]);
        drop(b);
        assert!(!tunnels.is_open(&id));
    }
}
