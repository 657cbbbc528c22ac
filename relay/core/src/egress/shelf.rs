//! The shelf between egress and the local provider: the CA a sandbox being created must trust.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// CA certificates (PEM) to install in sandboxes being created, by sandbox id: the egress
/// service puts one there before the provider creates the sandbox, the local provider takes it.
#[derive(Clone, Debug, Default)]
pub struct TrustShelf(Arc<Mutex<HashMap<String, String>>>);

impl TrustShelf {
    /// Puts the CA certificate sandbox `id` must trust on the shelf.
    pub fn put(&self, id: &str, cert_pem: String) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), cert_pem);
    }

    /// The CA certificate sandbox `id` must trust, if it has one; taken off the shelf.
    pub fn take(&self, id: &str) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(id)
    }
}
