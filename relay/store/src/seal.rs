//! The relay's secret key and the sealing of values under it, so `relay.db` never holds an
//! agent token (or another secret) in plain text.
//!
//! The relay must present each agent token to its agent, so a hash will not do: values are
//! encrypted with XChaCha20-Poly1305 under a 256-bit key kept in `relay.key` beside the
//! database (mode 0600), with a random nonce per value and a context (the sandbox id and
//! column) as associated data, so a sealed value copied onto another row or column does not
//! open. A copy of the database alone (a backup, a leaked file) reveals no token.

use std::path::{Path, PathBuf};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

/// The key file, beside the database.
pub const KEY_FILE: &str = "relay.key";
/// Bytes in the key: XChaCha20-Poly1305's 256 bits.
const KEY_BYTES: usize = 32;
/// Bytes in a nonce: XChaCha20's 192 bits, large enough to draw at random.
const NONCE_BYTES: usize = 24;
/// What a sealed token starts with: the format's version. Anything else in the column is a
/// token from before sealing, which [`super::Store`] seals when it opens the database.
pub(super) const SEALED_PREFIX: &str = "x1:";

/// Why the key could not be loaded or a token opened.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The key file cannot be read or written.
    #[error("cannot {what} the relay's key file {path}: {source}; check the data directory's permissions and that its disk has free space")]
    Io {
        /// Read or create.
        what: &'static str,
        /// The key file.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// The key file holds something else than a key.
    #[error(
        "the relay's key file {0} is damaged (it must hold {KEY_BYTES} hex-encoded bytes); \
         restore it from the backup of this data directory"
    )]
    Damaged(PathBuf),
    /// A sealed value does not open under this key.
    #[error(
        "{0} of the relay database cannot be decrypted with this relay's key; restore the \
         relay.key that belongs with this relay.db"
    )]
    WrongKey(String),
}

/// The relay's key.
pub(super) struct SealKey {
    cipher: XChaCha20Poly1305,
    /// Keys for other purposes are derived from it ([`SealKey::derive`]).
    bytes: [u8; KEY_BYTES],
}

impl SealKey {
    /// Reads the key in `path`, or creates one there (mode 0600). Returns whether it is new.
    pub(super) fn load_or_create(path: &Path) -> Result<(SealKey, bool), SealError> {
        match SealKey::load(path)? {
            Some(key) => Ok((key, false)),
            None => Ok((SealKey::create(path)?, true)),
        }
    }

    /// Reads the key in `path`; `None` when there is no such file.
    pub(super) fn load(path: &Path) -> Result<Option<SealKey>, SealError> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let bytes = hex::decode(text.trim())
                    .ok()
                    .filter(|b| b.len() == KEY_BYTES)
                    .ok_or_else(|| SealError::Damaged(path.to_path_buf()))?;
                Ok(Some(SealKey::from_bytes(&bytes)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(SealError::Io {
                what: "read",
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Creates a new random key in `path` (mode 0600), which must not exist.
    pub(super) fn create(path: &Path) -> Result<SealKey, SealError> {
        let io = |source| SealError::Io {
            what: "create",
            path: path.to_path_buf(),
            source,
        };
        let bytes: [u8; KEY_BYTES] = rand::random();
        // Never replaces a file: if another process raced us here, its key wins and ours fails
        // loudly rather than replacing a key some tokens may already be sealed under. Nothing
        // is left on a full disk.
        tether_client::local::create_private(path, &format!("{}\n", hex::encode(bytes)))
            .map_err(io)?;
        Ok(SealKey::from_bytes(&bytes))
    }

    /// A fresh key that lives in memory only.
    pub(super) fn random() -> SealKey {
        SealKey::from_bytes(&rand::random::<[u8; KEY_BYTES]>())
    }

    fn from_bytes(bytes: &[u8]) -> SealKey {
        let mut raw = [0; KEY_BYTES];
        raw.copy_from_slice(bytes);
        SealKey {
            cipher: XChaCha20Poly1305::new(bytes.into()),
            bytes: raw,
        }
    }

    /// A key for `purpose`, derived from this one (HMAC-SHA256 under it): whoever holds the
    /// relay's key holds it, and knowing it reveals nothing of the relay's key.
    pub(super) fn derive(&self, purpose: &str) -> [u8; 32] {
        use hmac::{Hmac, Mac};
        let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(&self.bytes)
            .expect("HMAC takes keys of any length");
        mac.update(b"tether-derived-key-v1:");
        mac.update(purpose.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// `token` sealed for `context`: [`SEALED_PREFIX`], then hex of nonce and ciphertext.
    pub(super) fn seal(&self, context: &str, token: &str) -> String {
        let nonce: [u8; NONCE_BYTES] = rand::random();
        let payload = Payload {
            msg: token.as_bytes(),
            aad: context.as_bytes(),
        };
        // Encryption fails only for messages beyond the cipher's 256 GiB limit.
        let sealed = self
            .cipher
            .encrypt(XNonce::from_slice(&nonce), payload)
            .expect("an agent token is far below XChaCha20-Poly1305's message limit");
        let mut out = Vec::with_capacity(NONCE_BYTES + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        format!("{SEALED_PREFIX}{}", hex::encode(out))
    }

    /// The value sealed for `context`.
    pub(super) fn open(&self, context: &str, sealed: &str) -> Result<String, SealError> {
        let wrong = || SealError::WrongKey(context.to_string());
        let bytes = sealed
            .strip_prefix(SEALED_PREFIX)
            .and_then(|h| hex::decode(h).ok())
            .filter(|b| b.len() > NONCE_BYTES)
            .ok_or_else(wrong)?;
        let (nonce, ciphertext) = bytes.split_at(NONCE_BYTES);
        let payload = Payload {
            msg: ciphertext,
            aad: context.as_bytes(),
        };
        let plain = self
            .cipher
            .decrypt(XNonce::from_slice(nonce), payload)
            .map_err(|_| wrong())?;
        String::from_utf8(plain).map_err(|_| wrong())
    }
}

/// Whether a stored agent token is sealed (rather than left from before sealing).
pub(super) fn is_sealed(stored: &str) -> bool {
    stored.starts_with(SEALED_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn seals_open_only_under_the_same_key_and_sandbox() {
        let key = SealKey::random();
        let sealed = key.seal("sb-1", "secret-token");
        assert!(is_sealed(&sealed) && !sealed.contains("secret-token"));
        assert_ne!(
            sealed,
            key.seal("sb-1", "secret-token"),
            "nonces are random"
        );
        assert_eq!(key.open("sb-1", &sealed).unwrap(), "secret-token");
        assert!(key.open("sb-2", &sealed).is_err(), "bound to its sandbox");
        assert!(SealKey::random().open("sb-1", &sealed).is_err());
        assert!(key.open("sb-1", "x1:00").is_err());
        assert!(key.open("sb-1", "plain").is_err());
    }

    #[test]
    fn derived_keys_differ_by_purpose_and_key() {
        let key = SealKey::random();
        assert_eq!(key.derive("a"), key.derive("a"));
        assert_ne!(key.derive("a"), key.derive("b"));
        assert_ne!(key.derive("a"), SealKey::random().derive("a"));
    }

    #[test]
    fn the_key_file_is_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        let (key, created) = SealKey::load_or_create(&path).unwrap();
        assert!(created);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let sealed = key.seal("sb-1", "t");
        let (again, created) = SealKey::load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(again.open("sb-1", &sealed).unwrap(), "t");

        std::fs::write(&path, "not a key").unwrap();
        let err = SealKey::load_or_create(&path).err().unwrap().to_string();
        assert!(err.contains("damaged"), "{err}");
    }
}
