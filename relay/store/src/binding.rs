//! Which store a data directory belongs to. A data directory holds sandboxes (local ones,
//! under `local/`) and an admin token whose records live in one store: its SQLite file, or a
//! PostgreSQL database. Started on the same directory with another store (a fresh SQLite file,
//! `--database` after SQLite, another database), a relay would take those sandboxes for
//! unknown ones and hand the directory's admin token to a store that never issued it.
//!
//! So a store gets an id, made once and kept in the store (setting `store_id`), and the data
//! directory records, in `store.id`, the id of the store it was first used with. A relay
//! starts only when the two agree; otherwise it stops before it touches anything, naming both.
//! The store's id is written before the directory's (each write atomic), so a crash between the
//! two leaves a directory not yet bound to a store that has an id, which the next start binds.

use std::io;
use std::path::{Path, PathBuf};

use super::backend::Backend;
use super::{Store, StoreError};

/// The file under the data directory that names the store it belongs to.
pub(super) const STORE_FILE: &str = "store.id";
/// The store's setting that holds its id.
const STORE_ID_SETTING: &str = "store_id";
/// The prefix of every store id.
const STORE_PREFIX: &str = "store-";
/// Random bytes in a store id (hex-encoded, so twice as many characters).
const STORE_ID_BYTES: usize = 16;

/// Why a relay may not use a data directory with the store it opened.
#[derive(Debug, thiserror::Error)]
pub enum BindingError {
    /// The data directory belongs to another store than the one this relay opened.
    #[error(
        "the data directory {dir} belongs to another store: its sandboxes and admin token are \
         registered in store {bound} ({bound_at}; recorded in {file}), but this relay opened \
         {here}; started on it, this relay would not know them. Start it with the store the \
         data directory was used with (without --database for its SQLite file, or with the \
         --database URL it had), or give this store another --data-dir. If the old store is \
         lost for good, move {file} aside: the relay then binds the directory to this store \
         and keeps the sandboxes it does not know, listed by `tether ls --orphans` for an \
         admin to remove"
    )]
    Mismatch {
        /// The data directory.
        dir: PathBuf,
        /// Its `store.id`.
        file: PathBuf,
        /// The store it belongs to.
        bound: String,
        /// Where that store was, as the relay that bound it said.
        bound_at: String,
        /// The store this relay opened, in words.
        here: String,
    },
    /// `store.id` cannot be read as one.
    #[error(
        "{file} is damaged ({reason}); restore it from a backup of the data directory (it names \
         the store the directory's sandboxes are registered in)"
    )]
    Damaged {
        /// The file.
        file: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// `store.id` cannot be read or written.
    #[error("cannot {what} {file}: {source}; check that the data directory is writable and that its disk has free space")]
    Io {
        /// Read or write.
        what: &'static str,
        /// The file.
        file: PathBuf,
        /// What the file system said.
        source: io::Error,
    },
    /// The store cannot be asked for its id, or take one.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a data directory's `store.id` says.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Bound {
    /// The store's id.
    id: String,
    /// Where the store was when the directory was bound to it (for messages only).
    at: String,
}

impl Store {
    /// Makes sure the data directory `dir` belongs to this store, binding a directory that
    /// belongs to none yet; returns the store's id. Must run under the directory's lock and
    /// before anything reads or writes what the directory holds (sandboxes, the admin token).
    pub async fn bind_data_dir(&self, dir: &Path) -> Result<String, BindingError> {
        bind(&*self.backend, dir).await
    }
}

/// [`Store::bind_data_dir`] on a bare backend: before a PostgreSQL database is sealed under
/// the relay's key, so a refused start leaves nothing of the directory in it.
pub(super) async fn bind(backend: &dyn Backend, dir: &Path) -> Result<String, BindingError> {
    let file = dir.join(STORE_FILE);
    let bound = read_bound(&file)?;
    let here = backend.setting(STORE_ID_SETTING.to_string()).await?;
    match (bound, here) {
        (Some(bound), Some(here)) if bound.id == here => Ok(here),
        (Some(bound), here) => Err(BindingError::Mismatch {
            dir: dir.to_path_buf(),
            file,
            bound: bound.id,
            bound_at: bound.at,
            here: match here {
                Some(id) => format!("store {id} ({})", backend.location()),
                None => format!(
                    "a store that no data directory was ever used with ({}: a new database)",
                    backend.location()
                ),
            },
        }),
        (None, _) => {
            // The store's first (kept if another relay of the database set it meanwhile),
            // then the directory's: never a directory naming an id its store lacks.
            let id = backend
                .setting_or_insert(STORE_ID_SETTING.to_string(), new_store_id())
                .await?;
            let text = format!("{id}\n{}\n", backend.location());
            tether_client::local::create_private(&file, &text).map_err(|source| {
                BindingError::Io {
                    what: "write",
                    file: file.clone(),
                    source,
                }
            })?;
            Ok(id)
        }
    }
}

/// A new random store id.
fn new_store_id() -> String {
    format!(
        "{STORE_PREFIX}{}",
        hex::encode(rand::random::<[u8; STORE_ID_BYTES]>())
    )
}

/// What `file` says; `None` when it does not exist (a directory bound to no store yet).
fn read_bound(file: &Path) -> Result<Option<Bound>, BindingError> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(BindingError::Io {
                what: "read",
                file: file.to_path_buf(),
                source,
            })
        }
    };
    let mut lines = text.lines();
    let id = lines.next().unwrap_or_default().trim().to_string();
    let valid = id.strip_prefix(STORE_PREFIX).is_some_and(|hex| {
        hex.len() == 2 * STORE_ID_BYTES && hex.bytes().all(|b| b.is_ascii_hexdigit())
    });
    if !valid {
        return Err(BindingError::Damaged {
            file: file.to_path_buf(),
            reason: format!("its first line is not a store id like {STORE_PREFIX}<32 hex digits>"),
        });
    }
    let at = lines.next().unwrap_or_default().trim();
    Ok(Some(Bound {
        id,
        at: match at.is_empty() {
            true => "where, unrecorded".to_string(),
            false => at.to_string(),
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_data_dir_is_bound_once_and_refuses_any_other_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_in_memory().unwrap();
        let id = store.bind_data_dir(dir.path()).await.unwrap();
        assert!(id.starts_with(STORE_PREFIX), "{id}");
        let file = dir.path().join(STORE_FILE);
        let written = std::fs::read_to_string(&file).unwrap();
        assert!(written.starts_with(&format!("{id}\n")), "{written}");
        // Again with the same store: the same id, the file untouched.
        assert_eq!(store.bind_data_dir(dir.path()).await.unwrap(), id);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), written);

        // A new store (a fresh SQLite file): refused, naming both, the file untouched.
        let fresh = Store::open_in_memory().unwrap();
        let err = fresh
            .bind_data_dir(dir.path())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(&id), "{err}");
        assert!(err.contains("a new database"), "{err}");
        assert!(
            err.contains("--database") && err.contains("--data-dir"),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), written);
        // A store bound to another directory: refused, naming its id too.
        let other_dir = tempfile::tempdir().unwrap();
        let other = fresh.bind_data_dir(other_dir.path()).await.unwrap();
        let err = fresh
            .bind_data_dir(dir.path())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(&id) && err.contains(&other), "{err}");

        // A second directory of the same store (a replica's) is bound to it.
        let replica = tempfile::tempdir().unwrap();
        assert_eq!(store.bind_data_dir(replica.path()).await.unwrap(), id);

        // A damaged file is named, never replaced.
        std::fs::write(&file, "not a store\n").unwrap();
        let err = store
            .bind_data_dir(dir.path())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("damaged"), "{err}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a store\n");
    }
}
