//! `tether pause`, `resume`, `stop` and `start`: a sandbox's processes frozen with their
//! memory kept and continued where they were, or ended with its disk kept and booted again.

use clap::Args;

use super::output;
use super::remote::Remote;
use tether_client::api::Power;

/// The sandboxes to act on.
#[derive(Debug, Args)]
pub(super) struct PowerArgs {
    /// The sandboxes.
    #[arg(value_name = "ID", required = true)]
    ids: Vec<String>,
    /// Print each sandbox as JSON (one per line) instead of its id.
    #[arg(long)]
    json: bool,
}

/// Changes each sandbox's power state (`action`) in turn; stops at the first failure.
pub(super) async fn run(remote: Remote, args: PowerArgs, action: Power) -> anyhow::Result<()> {
    let rest = remote.rest()?;
    for id in &args.ids {
        let sandbox = rest
            .power(id, action)
            .await
            .map_err(|e| remote.explain(e, Some(id)))?;
        if args.json {
            output::json_line(&sandbox)?;
        } else {
            println!("{}", sandbox.id);
        }
    }
    Ok(())
}
