//! Which sandboxes have a client connected right now: the reaper never idles those out, and
//! counts them as active every [`ACTIVITY_INTERVAL`](super::constants::ACTIVITY_INTERVAL).
//! Each sandbox may have at most [`MAX_TUNNELS_PER_SANDBOX`] open at once: every tunnel holds
//! two of the relay's descriptors, which one sandbox's clients must not take from the rest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::constants::MAX_TUNNELS_PER_SANDBOX;
use crate::store::SandboxId;

/// A sandbox already has as many tunnels open as one may.
#[derive(Debug, thiserror::Error)]
#[error(
    "sandbox {0} already has {MAX_TUNNELS_PER_SANDBOX} sessions open through the relay, the \
     most one sandbox may have; close some (`tether forward`, `exec`, SDK sessions) and retry"
)]
pub(super) struct TooManyTunnels(SandboxId);

/// Open tunnels per sandbox.
#[derive(Default)]
pub(super) struct Tunnels {
    open: Mutex<HashMap<SandboxId, usize>>,
}

impl Tunnels {
    /// Counts a tunnel to `id` as open until the guard drops; refused when `id` has
    /// [`MAX_TUNNELS_PER_SANDBOX`] open already.
    pub(super) fn open(self: &Arc<Self>, id: SandboxId) -> Result<TunnelGuard, TooManyTunnels> {
        let mut open = self.lock();
        let count = open.entry(id.clone()).or_default();
        if *count >= MAX_TUNNELS_PER_SANDBOX {
            return Err(TooManyTunnels(id));
        }
        *count += 1;
        drop(open);
        Ok(TunnelGuard {
            tunnels: self.clone(),
            id,
        })
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
        let a = tunnels.open(id.clone()).unwrap();
        let b = tunnels.open(id.clone()).unwrap();
        drop(a);
        assert!(tunnels.is_open(&id));
        assert_eq!(tunnels.open_ids(), vec![id.clone()]);
        drop(b);
        assert!(!tunnels.is_open(&id));
    }

    #[test]
    fn one_sandbox_may_not_take_more_than_its_share() {
        let tunnels = Arc::new(Tunnels::default());
        let id = SandboxId::from("sb-x".to_string());
        let other = SandboxId::from("sb-y".to_string());
        let mut held: Vec<_> = (0..MAX_TUNNELS_PER_SANDBOX)
            .map(|_| tunnels.open(id.clone()).unwrap())
            .collect();
        let refused = tunnels.open(id.clone()).err().unwrap().to_string();
        assert!(refused.contains("sandbox sb-x already has"), "{refused}");
        // Another sandbox is not affected, and a closed tunnel frees a place.
        tunnels.open(other).unwrap();
        held.pop();
        tunnels.open(id).unwrap();
    }
}
