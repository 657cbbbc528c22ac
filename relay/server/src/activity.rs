//! Which sandboxes have a client connected right now: the reaper never idles those out, and
//! counts them as active every [`ACTIVITY_INTERVAL`](super::constants::ACTIVITY_INTERVAL).
//! Each sandbox may have at most [`MAX_TUNNELS_PER_SANDBOX`] open at once: every tunnel holds
//! two of the relay's descriptors, which one sandbox's clients must not take from the rest.
//!
//! Also which sandboxes had activity the store could not record (its disk full, its
//! database unreachable): a client's session never fails for that, and the reaper treats them
//! as active until the record is written, so a relay that could not write never idles out a
//! sandbox that was in use.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use super::constants::MAX_TUNNELS_PER_SANDBOX;
use tether_store::SandboxId;

/// A sandbox already has as many tunnels open as one may.
#[derive(Debug, thiserror::Error)]
#[error(
    "sandbox {0} already has {MAX_TUNNELS_PER_SANDBOX} sessions open through the relay, the \
     most one sandbox may have; close some (`tether forward`, `exec`, SDK sessions) and retry"
)]
pub(super) struct TooManyTunnels(SandboxId);

/// Open tunnels per sandbox, and activity not yet recorded.
#[derive(Default)]
pub(super) struct Tunnels {
    open: Mutex<HashMap<SandboxId, usize>>,
    unrecorded: Mutex<HashSet<SandboxId>>,
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

    /// Whether `id` counts as in use: a tunnel to it is open, or it had activity the store
    /// has not recorded yet.
    pub(super) fn is_active(&self, id: &SandboxId) -> bool {
        self.lock().contains_key(id) || lock(&self.unrecorded).contains(id)
    }

    /// Every sandbox whose activity the store should record now: those with an open tunnel
    /// and those whose last record failed. Once written, pass them to [`Tunnels::recorded`].
    pub(super) fn to_record(&self) -> Vec<SandboxId> {
        // Locked in the order `is_active` takes them: open, then unrecorded.
        let open = self.lock();
        let unrecorded = lock(&self.unrecorded);
        let not_open = unrecorded.iter().filter(|id| !open.contains_key(*id));
        open.keys().chain(not_open).cloned().collect()
    }

    /// Notes that activity on `id` could not be recorded; whether it was recorded until now.
    pub(super) fn unrecorded(&self, id: SandboxId) -> bool {
        lock(&self.unrecorded).insert(id)
    }

    /// The activity of `ids` is in the store now.
    pub(super) fn recorded(&self, ids: &[SandboxId]) {
        let mut unrecorded = lock(&self.unrecorded);
        for id in ids {
            unrecorded.remove(id);
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<SandboxId, usize>> {
        lock(&self.open)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each map is consistent after every statement, so a poisoned lock is safe to use.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
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
        assert!(tunnels.is_active(&id));
        assert_eq!(tunnels.to_record(), vec![id.clone()]);
        drop(b);
        assert!(!tunnels.is_active(&id));
        assert!(tunnels.to_record().is_empty());
    }

    #[test]
    fn activity_not_recorded_counts_until_it_is() {
        let tunnels = Arc::new(Tunnels::default());
        let id = SandboxId::from("sb-x".to_string());
        let other = SandboxId::from("sb-y".to_string());
        let open = tunnels.open(other.clone()).unwrap();
        tunnels.unrecorded(id.clone());
        tunnels.unrecorded(other.clone());
        assert!(tunnels.is_active(&id));
        let mut due = tunnels.to_record();
        due.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        assert_eq!(due, vec![id.clone(), other.clone()], "each once");
        // A write that covered only `other` leaves `id` to record.
        tunnels.recorded(std::slice::from_ref(&other));
        assert_eq!(tunnels.to_record(), vec![other.clone(), id.clone()]);
        tunnels.recorded(&tunnels.to_record());
        assert!(!tunnels.is_active(&id));
        drop(open);
        assert!(!tunnels.is_active(&other));
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
