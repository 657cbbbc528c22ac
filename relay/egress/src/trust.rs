//! Installing the egress CA of a sandbox that does not run on the relay's host (a cloud
//! sandbox with secrets) through its agent, once it is created: the same files a local
//! sandbox gets ([`CA_PATH`], [`BUNDLE_PATH`], and the system bundles it has, replaced by the
//! bundle), each written atomically by the agent. Only the certificate goes; the key never
//! leaves the relay.

use tether_client::{ClientError, Session};
use tether_proto::op::{FileKind, FileStat};

use super::ca::{bundle, BUNDLE_PATH, CA_PATH, SYSTEM_BUNDLES};

/// Largest system bundle read from a sandbox: 16 MiB (Debian's is about 200 KiB).
const MAX_BUNDLE_BYTES: u64 = 16 << 20;

/// Why the CA could not be installed.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot install the egress CA through the sandbox's agent: writing {path} failed ({source}); \
     secrets on a sandbox elsewhere need an image whose agent may write /etc (one running as \
     root, with a writable root file system)"
)]
pub struct TrustError {
    /// The file that could not be written.
    pub path: String,
    /// What the agent said.
    #[source]
    pub source: ClientError,
}

/// Installs `ca_pem` in the sandbox `session` reaches; returns the system bundles it replaced.
pub async fn install(session: &Session, ca_pem: &str) -> Result<Vec<String>, TrustError> {
    let mut system = None;
    let mut replaced = Vec::new();
    for rel in SYSTEM_BUNDLES {
        let path = format!("/{rel}");
        let Ok(stat) = session.stat(path.as_str()).await else {
            continue;
        };
        // A link (Red Hat's bundle is one) is replaced by a file: the sandbox's own business.
        if !matches!(stat.kind, FileKind::File | FileKind::Symlink) {
            continue;
        }
        if system.is_none() {
            let text = match followed_size(session, &path, &stat).await {
                Some(size) if size <= MAX_BUNDLE_BYTES => session.read_file(path.as_str()).await,
                _ => Ok(Vec::new()),
            };
            if let Ok(bytes) = text {
                system = Some(String::from_utf8_lossy(&bytes).into_owned());
            }
        }
        replaced.push(path);
    }
    let bundle = bundle(system.as_deref().unwrap_or(""), ca_pem);
    let mut writes = vec![
        (CA_PATH.to_string(), ca_pem),
        (BUNDLE_PATH.to_string(), &bundle),
    ];
    writes.extend(replaced.iter().map(|path| (path.clone(), bundle.as_str())));
    for (path, text) in writes {
        session
            .write_file(path.as_str(), text.as_bytes())
            .await
            .map_err(|source| TrustError {
                path: path.clone(),
                source,
            })?;
    }
    Ok(replaced)
}

/// The size of what `path` (stat'd as `stat`, links not followed) holds: a link's target is
/// stat'd in turn, once.
async fn followed_size(session: &Session, path: &str, stat: &FileStat) -> Option<u64> {
    match (&stat.kind, &stat.target) {
        (FileKind::File, _) => Some(stat.size),
        (FileKind::Symlink, Some(target)) => {
            let target = target.to_string_lossy();
            let resolved = if target.starts_with('/') {
                target.into_owned()
            } else {
                let dir = path.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
                format!("{dir}/{target}")
            };
            let followed = session.stat(resolved.as_str()).await.ok()?;
            (followed.kind == FileKind::File).then_some(followed.size)
        }
        _ => None,
    }
}
