//! Per-key async locks: make get-or-create atomic for one tenant and label set within one relay
//! (the SQLite backend needs no more; PostgreSQL adds an advisory lock across relays) without
//! serializing creates that cannot collide.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

/// A lock per key, created on first use and forgotten once nobody holds or awaits it.
#[derive(Default)]
pub(crate) struct KeyedLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl KeyedLocks {
    /// Waits for the lock on `key`; it is released when the guard drops.
    pub(crate) async fn lock(&self, key: String) -> OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            // An entry only the map holds is unused. Sweeping here (rather than on guard
            // drop) also catches waiters that were cancelled.
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
            locks.entry(key).or_default().clone()
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn same_key_waits_other_key_does_not() {
        let locks = Arc::new(KeyedLocks::default());
        let held = locks.lock("a".into()).await;
        let other = tokio::time::timeout(Duration::from_secs(5), locks.lock("b".into())).await;
        assert!(other.is_ok(), "another key must not wait");
        let same = tokio::time::timeout(Duration::from_millis(50), locks.lock("a".into())).await;
        assert!(same.is_err(), "the same key must wait");
        drop(held);
        let again = tokio::time::timeout(Duration::from_secs(5), locks.lock("a".into())).await;
        assert!(again.is_ok());
    }
}
