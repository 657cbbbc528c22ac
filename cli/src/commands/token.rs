//! `tether token`: API tokens, minted by an admin token.

use clap::{Args, Subcommand};

use super::output;
use super::remote::Remote;

/// `tether token ...`.
#[derive(Debug, Subcommand)]
pub(super) enum TokenCommand {
    /// Mint a token for a tenant and print it (it is shown once).
    Create(CreateArgs),
}

/// `tether token create`.
#[derive(Debug, Args)]
pub(super) struct CreateArgs {
    /// The tenant the token acts for; each tenant sees only its own sandboxes.
    #[arg(long, value_name = "NAME")]
    tenant: String,
    /// The token may mint tokens too.
    #[arg(long)]
    admin: bool,
    /// Print the token and its tenant as JSON.
    #[arg(long)]
    json: bool,
}

pub(super) async fn run(remote: Remote, cmd: TokenCommand) -> anyhow::Result<()> {
    let TokenCommand::Create(args) = cmd;
    let rest = remote.rest()?;
    let minted = rest
        .create_token(&args.tenant, args.admin)
        .await
        .map_err(|e| remote.explain(e, None))?;
    if args.json {
        output::json(&minted)
    } else {
        println!("{}", minted.token);
        Ok(())
    }
}
