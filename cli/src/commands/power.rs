//! `tether pause`, `resume`, `stop` and `start`: a sandbox's processes frozen with their
//! memory kept and continued where they were, or ended with its disk kept and booted again.

use clap::Args;

use super::output;
use super::remote::Remote;

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

/// What to do to each sandbox.
#[derive(Clone, Copy, Debug)]
pub(super) enum Power {
    Pause,
    Resume,
    Stop,
    Start,
}

/// Acts on each sandbox in turn; stops at the first failure.
pub(super) async fn run(remote: Remote, args: PowerArgs, power: Power) -> anyhow::Result<()> {
    let rest = remote.rest()?;
    for id in &args.ids {
        let done = match power {
            Power::Pause => rest.pause(id).await,
            Power::Resume => rest.resume(id).await,
            Power::Stop => rest.stop(id).await,
            Power::Start => rest.start(id).await,
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
