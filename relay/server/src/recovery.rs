//! Crash recovery at relay start, before any request is served. Only what this relay's own
//! create journal proves it began is removed: every create it journaled (the row names this
//! relay's node) was interrupted (a create in progress ends either registered or undone), so
//! what it made is removed at its provider. Every other sandbox a provider holds for this relay
//! that neither the store nor the journal accounts for is reported, one line per sandbox
//! naming its id and where it is, and kept: it may be registered in another store or a
//! database restored later, and only an admin may remove it (`tether ls --orphans` lists it,
//! `tether rm ID` removes it). One line sums up what was done.
//!
//! A registered sandbox is never touched, and nothing is removed on a state that could not be
//! read: if the store or the journal cannot be read, recovery is skipped with a warning and
//! tried again at the next start; a journaled create whose removal fails stays journaled.
//! The data directory was checked to belong to this store before (`store::binding`).

use std::collections::HashSet;

use futures_util::future::join_all;
use tracing::{info, warn};

use super::state::Relay;
use tether_relay_core::provider::Unfinished;
use tether_store::PendingCreate;

/// Finishes interrupted creates, reports unaccounted sandboxes, then logs a summary.
pub(super) async fn run(relay: &Relay) {
    let (registered, pending) = match (
        relay.store.all_ids().await,
        relay.store.pending_creates(Some(&relay.node)).await,
    ) {
        (Ok(ids), Ok(pending)) => (ids, pending),
        (Err(e), _) | (_, Err(e)) => {
            return warn!(
                "cannot read the store to recover from a crash: {e}; nothing was removed, \
                 and recovery runs again at the next start"
            )
        }
    };
    let registered: HashSet<String> = registered.iter().map(|id| id.to_string()).collect();
    let outcomes = join_all(
        pending
            .into_iter()
            .map(|create| finish(relay, create, &registered)),
    )
    .await;
    let mut accounted = registered;
    let mut finished = 0;
    for (id, outcome) in outcomes {
        match outcome {
            Outcome::Finished => finished += 1,
            Outcome::Stale => {}
            // Kept journaled: never reported as unaccounted behind the journal's back.
            Outcome::Kept => {
                accounted.insert(id);
            }
        }
    }
    let mut kept = Vec::new();
    for provider in relay.providers.values() {
        match provider.unaccounted(&accounted).await {
            Ok(found) => {
                for sandbox in found {
                    warn!(
                        "sandbox {id} ({place}) is in neither this relay's store ({store}) nor \
                         its create journal: kept, with everything it holds. If it is not \
                         wanted, an admin removes it with `tether rm {id}` (the relay's admin \
                         token); `tether ls --orphans` lists every such sandbox",
                        id = sandbox.id,
                        place = sandbox.place,
                        store = relay.store.location(),
                    );
                    kept.push(sandbox.id);
                }
            }
            Err(e) => warn!(
                "cannot look for unaccounted sandboxes of provider `{}`: {e}; it is looked at \
                 again at the next start",
                provider.name()
            ),
        }
    }
    if finished > 0 || !kept.is_empty() {
        info!(
            "reconciled: finished {finished} interrupted creates; kept {} sandboxes nothing \
             accounts for ({}), for an admin to review with `tether ls --orphans`",
            kept.len(),
            kept.join(", ")
        );
    }
}

/// What became of one journaled create.
enum Outcome {
    /// What it made is removed and it is forgotten.
    Finished,
    /// Its sandbox is registered: only the journal row, stale, is gone.
    Stale,
    /// It stays journaled, for the next start.
    Kept,
}

/// Removes what the interrupted `create` made and forgets it; returns its id and outcome.
async fn finish(
    relay: &Relay,
    create: PendingCreate,
    registered: &HashSet<String>,
) -> (String, Outcome) {
    let id = create.id.to_string();
    // A row journaled before relays had ids proves whose create it was only where one relay
    // uses the store; in a shared database it may be another relay's, under way.
    if create.node.is_none() && relay.cluster.shared {
        warn!(
            "sandbox {id} was journaled (provider `{}`) before relays had ids, in a database \
             relays share, so nothing proves this relay began it: kept journaled. Once no \
             relay of the database is creating it, look for it at that provider (label \
             tether.sandbox={id}), remove what you find, then the row: `DELETE FROM \
             create_journal WHERE sandbox_id = '{id}'`",
            create.provider
        );
        return (id, Outcome::Kept);
    }
    // Registered after all (the row outlived its insert, or was written by someone else):
    // the sandbox is the store's, and only the row goes.
    let stale = registered.contains(&id);
    if !stale {
        let Some(provider) = relay.providers.get(create.provider.as_str()) else {
            warn!(
                "an interrupted create of sandbox {id} used provider `{}`, which this relay \
                 does not have configured; restart the relay with it to remove what it made",
                create.provider
            );
            return (id, Outcome::Kept);
        };
        match provider
            .remove_unfinished(&id, create.provider_ref.as_deref())
            .await
        {
            Ok(Unfinished::Removed) => {}
            Ok(Unfinished::Untraceable(hint)) => warn!(
                tenant = %create.tenant,
                "the relay stopped while provider `{}` was creating sandbox {id}, before it \
                 answered; it may have made one: {hint}",
                create.provider
            ),
            Err(e) => {
                warn!(
                    "cannot remove what the interrupted create of sandbox {id} made: {e}; \
                     trying again at the next start"
                );
                return (id, Outcome::Kept);
            }
        }
    }
    match relay.store.finish_create(&create.id).await {
        Ok(()) if stale => (id, Outcome::Stale),
        Ok(()) => (id, Outcome::Finished),
        Err(e) => {
            warn!("cannot finish the interrupted create of sandbox {id}: {e}");
            (id, Outcome::Kept)
        }
    }
}
