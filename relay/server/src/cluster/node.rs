//! This relay's identity among the relays sharing its database: a node id made once and kept
//! in `<data_dir>/node.id`, so a restarted relay owns the sandboxes on its host again.

use std::path::Path;

use anyhow::Context;

use tether_store::NodeId;

/// The file under the data directory that holds the node id.
pub(crate) const NODE_FILE: &str = "node.id";

/// The node id kept in `dir`, made (and written, mode 0600) on first use.
pub(crate) fn load_or_create(dir: &Path) -> anyhow::Result<NodeId> {
    let path = dir.join(NODE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            return NodeId::parse(text.trim()).with_context(|| {
                format!(
                    "{} is damaged; restore it from a backup of the data directory, or delete \
                     it if no sandbox on this host was ever created (a new id is made)",
                    path.display()
                )
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
    let node = NodeId::generate();
    // Never replaces one (the data directory's lock is held, so nobody races us), and leaves
    // nothing on a full disk.
    tether_client::local::create_private(&path, &format!("{node}\n"))
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        assert!(first.as_str().starts_with("node-"), "{first}");
        assert_eq!(load_or_create(dir.path()).unwrap(), first);
        std::fs::write(dir.path().join(NODE_FILE), "not an id!\n").unwrap();
        let err = format!("{:#}", load_or_create(dir.path()).unwrap_err());
        assert!(err.contains("damaged"), "{err}");
    }
}
