//! Grants: how one relay tells another "this tenant may use this sandbox of yours, now".
//!
//! The relay a client reaches (the entry) decides the tenant's authorization as for any
//! request (its API token, or a preview token), then asks the relay that owns the sandbox
//! with a grant: the sandbox, its tenant, the operation, both relays' node ids, an expiry and a
//! random nonce, signed with HMAC-SHA256 under the cluster key (derived from the key every
//! relay of the database shares). The owner checks the signature in constant time, that the
//! grant is for it, for this sandbox and this operation, not expired (nor issued implausibly
//! far ahead) and not seen before, and then finds the sandbox under the grant's tenant itself.
//! A tenant's token never travels between relays, and nothing but a relay holding the key can
//! make a grant.

use std::collections::HashMap;
use std::sync::Mutex;

use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::super::constants::GRANT_LIFETIME;
use tether_store::{millis, NodeId, SandboxId, Tenant};

/// The header that carries a grant.
pub(crate) const GRANT_HEADER: &str = "x-tether-cluster-grant";
/// The version prefix of the grant format.
const VERSION: &str = "v1";
/// Random bytes in a nonce.
const NONCE_BYTES: usize = 16;

/// What the grant lets its bearer do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Op {
    /// Open a session (a tunnel) to the sandbox's agent.
    Session,
    /// Delete the sandbox at its provider.
    Delete,
    /// Pause the sandbox at its provider.
    Pause,
    /// Resume the paused sandbox at its provider.
    Resume,
    /// Stop the sandbox at its provider.
    Stop,
    /// Start the stopped sandbox at its provider.
    Start,
}

impl Op {
    /// The operation's name, as in its grant, the last segment of its route and messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Session => "session",
            Op::Delete => "delete",
            Op::Pause => "pause",
            Op::Resume => "resume",
            Op::Stop => "stop",
            Op::Start => "start",
        }
    }
}

/// The signed statement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Grant {
    /// The sandbox.
    pub sandbox: String,
    /// The tenant the entry relay authorized.
    pub tenant: String,
    /// What for.
    pub op: Op,
    /// The entry relay.
    pub from: String,
    /// The owner, the only relay that accepts it.
    pub to: String,
    /// When it stops being valid, ms since the Unix epoch.
    pub exp_ms: i64,
    /// Random, so a grant is accepted once.
    pub nonce: String,
}

/// Why a grant was refused. The owner answers every refusal alike (a 401 naming the reason),
/// since only relays, not tenants, ever send grants.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No grant header.
    #[error("no cluster grant was sent; this endpoint is for the relays of one database only")]
    Missing,
    /// Not a grant, or signed with another key.
    #[error(
        "the cluster grant is not valid: malformed, or signed with another key (every relay \
         sharing a database needs the same key file)"
    )]
    BadSignature,
    /// For another relay, sandbox or operation.
    #[error("the cluster grant is for {0}, not for this request")]
    Mismatch(&'static str),
    /// Expired, or issued too far ahead.
    #[error("the cluster grant has expired (or the relays' clocks disagree by more than {GRANT_LIFETIME:?})")]
    Expired,
    /// Used already.
    #[error("the cluster grant was used already")]
    Replayed,
}

/// Signs grants and checks them; remembers the nonces seen until their grants expire.
pub(crate) struct Grants {
    key: [u8; 32],
    seen: Mutex<HashMap<String, i64>>,
}

impl Grants {
    /// Grants under the cluster key `key`.
    pub(crate) fn new(key: [u8; 32]) -> Grants {
        Grants {
            key,
            seen: Mutex::default(),
        }
    }

    fn mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("HMAC takes keys of any length")
    }

    /// A grant from `from` to `to` for `op` on the tenant's sandbox, valid from `now_ms`.
    pub(crate) fn issue(
        &self,
        op: Op,
        sandbox: &SandboxId,
        tenant: &Tenant,
        from: &NodeId,
        to: &NodeId,
        now_ms: i64,
    ) -> String {
        let grant = Grant {
            sandbox: sandbox.to_string(),
            tenant: tenant.to_string(),
            op,
            from: from.to_string(),
            to: to.to_string(),
            exp_ms: now_ms.saturating_add(millis(GRANT_LIFETIME)),
            nonce: hex::encode(rand::random::<[u8; NONCE_BYTES]>()),
        };
        let body = serde_json::to_vec(&grant).expect("a grant serializes");
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(body);
        let signed = format!("{VERSION}.{payload}");
        let mut mac = self.mac();
        mac.update(signed.as_bytes());
        format!("{signed}.{}", hex::encode(mac.finalize().into_bytes()))
    }

    /// Checks `presented` for `op` on sandbox `id` at relay `me`, at `now_ms`, and uses it up.
    pub(crate) fn verify(
        &self,
        presented: Option<&str>,
        op: Op,
        id: &str,
        me: &NodeId,
        now_ms: i64,
    ) -> Result<Grant, Refused> {
        let presented = presented.ok_or(Refused::Missing)?;
        let (signed, tag) = presented.rsplit_once('.').ok_or(Refused::BadSignature)?;
        let tag = hex::decode(tag).map_err(|_| Refused::BadSignature)?;
        let mut mac = self.mac();
        mac.update(signed.as_bytes());
        // `verify_slice` compares in constant time.
        mac.verify_slice(&tag).map_err(|_| Refused::BadSignature)?;
        let payload = signed
            .strip_prefix(VERSION)
            .and_then(|rest| rest.strip_prefix('.'))
            .ok_or(Refused::BadSignature)?;
        let body = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| Refused::BadSignature)?;
        let grant: Grant = serde_json::from_slice(&body).map_err(|_| Refused::BadSignature)?;
        if grant.to != me.as_str() {
            return Err(Refused::Mismatch("another relay"));
        }
        if grant.sandbox != id {
            return Err(Refused::Mismatch("another sandbox"));
        }
        if grant.op != op {
            return Err(Refused::Mismatch("another operation"));
        }
        let latest = now_ms.saturating_add(millis(GRANT_LIFETIME));
        if grant.exp_ms <= now_ms || grant.exp_ms > latest.saturating_add(millis(GRANT_LIFETIME)) {
            return Err(Refused::Expired);
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|_, exp| *exp > now_ms);
        if seen.insert(grant.nonce.clone(), grant.exp_ms).is_some() {
            return Err(Refused::Replayed);
        }
        Ok(grant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> (SandboxId, Tenant, NodeId, NodeId) {
        (
            SandboxId::from("sb-1".to_string()),
            Tenant::parse("team-a").unwrap(),
            NodeId::parse("node-entry").unwrap(),
            NodeId::parse("node-owner").unwrap(),
        )
    }

    #[test]
    fn a_grant_is_accepted_once_by_its_owner_for_its_sandbox_and_operation() {
        let grants = Grants::new([7; 32]);
        let (sb, tenant, entry, owner) = ids();
        let now = 1_000_000;
        let grant = grants.issue(Op::Session, &sb, &tenant, &entry, &owner, now);
        let ok = grants.verify(Some(&grant), Op::Session, "sb-1", &owner, now + 5);
        assert_eq!(ok.unwrap().tenant, "team-a");
        let again = grants.verify(Some(&grant), Op::Session, "sb-1", &owner, now + 6);
        assert_eq!(again, Err(Refused::Replayed));

        let fresh = || grants.issue(Op::Session, &sb, &tenant, &entry, &owner, now);
        let check = |g: &str, op, id, me: &NodeId, at| grants.verify(Some(g), op, id, me, at);
        assert_eq!(
            check(&fresh(), Op::Session, "sb-2", &owner, now),
            Err(Refused::Mismatch("another sandbox"))
        );
        assert_eq!(
            check(&fresh(), Op::Delete, "sb-1", &owner, now),
            Err(Refused::Mismatch("another operation"))
        );
        assert_eq!(
            check(&fresh(), Op::Session, "sb-1", &entry, now),
            Err(Refused::Mismatch("another relay"))
        );
        let late = now + millis(GRANT_LIFETIME);
        assert_eq!(
            check(&fresh(), Op::Session, "sb-1", &owner, late),
            Err(Refused::Expired)
        );
        let early = now - 3 * millis(GRANT_LIFETIME);
        assert_eq!(
            check(&fresh(), Op::Session, "sb-1", &owner, early),
            Err(Refused::Expired)
        );
    }

    #[test]
    fn forged_and_tampered_grants_are_refused() {
        let (sb, tenant, entry, owner) = ids();
        let now = 1_000_000;
        let ours = Grants::new([7; 32]);
        let theirs = Grants::new([8; 32]);
        let forged = theirs.issue(Op::Session, &sb, &tenant, &entry, &owner, now);
        let verify = |g: Option<&str>| ours.verify(g, Op::Session, "sb-1", &owner, now);
        assert_eq!(verify(Some(&forged)), Err(Refused::BadSignature));
        assert_eq!(verify(None), Err(Refused::Missing));
        for junk in ["", "v1", "v1.x.y", "tether_abc", "v1..00"] {
            assert_eq!(verify(Some(junk)), Err(Refused::BadSignature), "{junk:?}");
        }
        // Another tenant written into a genuine grant breaks its signature.
        let genuine = ours.issue(Op::Session, &sb, &tenant, &entry, &owner, now);
        let (signed, tag) = genuine.rsplit_once('.').unwrap();
        let payload = signed.strip_prefix("v1.").unwrap();
        let body = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap();
        let swapped = String::from_utf8(body).unwrap().replace("team-a", "team-b");
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(swapped);
        let tampered = format!("v1.{payload}.{tag}");
        assert_eq!(verify(Some(&tampered)), Err(Refused::BadSignature));
    }
}
