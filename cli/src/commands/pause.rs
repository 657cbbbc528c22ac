//! `tether pause` and `tether resume`: a sandbox's processes frozen with their memory kept,
//! and continued where they were.

use clap::Args;

use super::output;
use super::remote::Remote;

/// `tether pause` and `tether resume`.
#[derive(Debug, Args)]
pub(super) struct PauseArgs {
    /// The sandboxes.
    #[arg(value_name = "ID", required = true)]
    ids: Vec<String>,
    /// Print each sandbox as JSON (one per line) instead of its id.
    #[arg(long)]
    json: bool,
}

/// Pauses (`resume` false) or resumes each sandbox in turn; stops at the first failure.
pub(super) async fn run(remote: Remote, args: PauseArgs, resume: bool) -> anyhow::Result<()> {
    let rest = remote.rest()?;
    for id in &args.ids {
        let done = match resume {
            false => rest.pause(id).await,
            true => rest.resume(id).await,
        };
        let sandbox = done.map_err(|e| remote.explain(e, Some(id)))?;
        if args.json {
            output::json_line(&sandbox)?;
        } else {
            println!("{}", sandbox.id);
        }
    }
    Ok(())
}
