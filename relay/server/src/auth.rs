//! API tokens: minting them, the admin token file, and the [`Caller`] extractor that turns a
//! request's bearer token into a tenant.
//!
//! Tokens are stored as SHA-256 hashes and looked up by hash, then the hash is compared in
//! constant time ([`Store::token`]): the secret itself is never compared, and no timing
//! depends on how much of a guess was right.
//!
//! The relay's own admin token (in `admin.token`) is the one [`Role::RelayAdmin`]: it alone
//! mints tokens for any tenant and mints admin tokens; a tenant's admin token mints member
//! tokens of its own tenant.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};
use tether_client::local;
use tether_proto::auth;
use tracing::info;

use super::caller::Caller;
use super::constants::{API_TOKEN_PREFIX, TOKEN_BYTES};
use super::error::ApiError;
use super::state::{now_ms, Relay};
use tether_store::{Role, Store, Tenant, TokenRecord};

impl FromRequestParts<Arc<Relay>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, relay: &Arc<Relay>) -> Result<Caller, ApiError> {
        let Some(header) = parts.headers.get(AUTHORIZATION) else {
            return Err(relay.unauthorized("no API token was sent"));
        };
        let Some(token) = header.to_str().ok().and_then(auth::bearer) else {
            return Err(relay.unauthorized("the Authorization header is not `Bearer <token>`"));
        };
        match relay.store.token(hash_token(token)).await? {
            Some(TokenRecord { tenant, role }) => Ok(Caller { tenant, role }),
            None => Err(relay.unauthorized("this API token is not known to this relay")),
        }
    }
}

/// The stored form of a token: its SHA-256, lowercase hex.
pub(super) fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A new random API token.
pub(super) fn mint_api_token() -> String {
    format!("{API_TOKEN_PREFIX}{}", random_hex())
}

/// A new random agent token, the secret between the relay and one sandbox's agent.
pub(super) fn mint_agent_token() -> String {
    random_hex()
}

fn random_hex() -> String {
    // `rand::random` draws from the thread-local CSPRNG, seeded from the OS.
    hex::encode(rand::random::<[u8; TOKEN_BYTES]>())
}

/// Mints and stores a token for `tenant`; returns the token, which is never stored.
pub(super) async fn create_token(
    store: &Store,
    tenant: Tenant,
    role: Role,
) -> Result<String, ApiError> {
    let token = mint_api_token();
    store
        .insert_token(hash_token(&token), TokenRecord { tenant, role }, now_ms())
        .await?;
    Ok(token)
}

/// The relay's admin token (of the `default` tenant), kept in `path` (mode 0600): reused when
/// the file holds one, minted and written (atomically) when there is no file. A file is never
/// replaced: one that holds no token is an error naming it. A token that was stored before
/// relay admins were told apart is made the relay admin again here. The data directory is
/// bound to this store before this runs (`store::binding`), so the file's token is this
/// store's own, never another store's taken over.
pub(super) async fn ensure_admin_token(store: &Store, path: &Path) -> anyhow::Result<String> {
    let existing = match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => anyhow::bail!(
            "{} holds no token; restore it from a backup of the data directory, or delete it \
             to have a new admin token minted (tokens minted with the old one keep working)",
            path.display()
        ),
        Ok(text) => Some(text.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let admin = TokenRecord {
        tenant: Tenant::default_tenant(),
        role: Role::RelayAdmin,
    };
    if let Some(token) = existing {
        let hash = hash_token(&token);
        // The file is the admin credential: whoever can read it owns the data directory
        // anyway. A database that lost it (deleted, restored) learns it again.
        if store.token(hash.clone()).await?.as_ref() != Some(&admin) {
            store.insert_token(hash, admin, now_ms()).await?;
        }
        return Ok(token);
    }
    let token = mint_api_token();
    store
        .insert_token(hash_token(&token), admin, now_ms())
        .await?;
    // Never over a file that appeared meanwhile: an existing admin token is never replaced.
    local::create_private(path, &format!("{token}\n"))
        .with_context(|| format!("cannot write the admin token to {}", path.display()))?;
    info!("wrote a new admin token to {}", path.display());
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn tokens_are_random_and_hashed() {
        let t = mint_api_token();
        assert!(t.starts_with(API_TOKEN_PREFIX));
        assert_eq!(t.len(), API_TOKEN_PREFIX.len() + 2 * TOKEN_BYTES);
        assert_ne!(t, mint_api_token());
        assert_eq!(mint_agent_token().len(), 2 * TOKEN_BYTES);
        assert_eq!(
            hash_token("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[tokio::test]
    async fn admin_token_is_written_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.token");
        let store = Store::open_in_memory().unwrap();

        let first = ensure_admin_token(&store, &path).await.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), first);
        // Written through a temporary file, which is gone.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let rec = store.token(hash_token(&first)).await.unwrap().unwrap();
        assert!(rec.role == Role::RelayAdmin && rec.tenant == Tenant::default_tenant());

        assert_eq!(ensure_admin_token(&store, &path).await.unwrap(), first);

        // A fresh database learns the token from the file.
        let fresh = Store::open_in_memory().unwrap();
        assert_eq!(ensure_admin_token(&fresh, &path).await.unwrap(), first);
        assert!(fresh.token(hash_token(&first)).await.unwrap().is_some());

        // An empty file is named, never replaced.
        std::fs::write(&path, "\n").unwrap();
        let empty = format!("{:#}", ensure_admin_token(&store, &path).await.unwrap_err());
        assert!(empty.contains("holds no token"), "{empty}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "\n");
        std::fs::write(&path, format!("{first}\n")).unwrap();

        // A lost file means a new admin token; the old one still works.
        std::fs::remove_file(&path).unwrap();
        let second = ensure_admin_token(&store, &path).await.unwrap();
        assert_ne!(second, first);
        assert!(store.token(hash_token(&first)).await.unwrap().is_some());
        assert!(store.token(hash_token(&second)).await.unwrap().is_some());

        // A database from before roles knew the file's token as a plain admin: it is the
        // relay's admin again, and the lost file's old token stays a tenant admin.
        let old = TokenRecord {
            tenant: Tenant::default_tenant(),
            role: Role::Admin,
        };
        store
            .insert_token(hash_token(&second), old.clone(), 0)
            .await
            .unwrap();
        store
            .insert_token(hash_token(&first), old.clone(), 0)
            .await
            .unwrap();
        ensure_admin_token(&store, &path).await.unwrap();
        let grant = |t: &str| store.token(hash_token(t));
        assert_eq!(
            grant(&second).await.unwrap().unwrap().role,
            Role::RelayAdmin
        );
        assert_eq!(grant(&first).await.unwrap(), Some(old));
    }
}
