//! `tether dev`: work here, run there. Finds the sandbox labelled for this folder (or
//! creates it), pushes the folder, keeps pushing changes in the background, forwards the
//! asked ports, and opens a shell in the synced directory. Leaving the shell keeps the
//! sandbox for next time unless `--rm` was given.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, FromArgMatches};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::forward::{self, Link};
use super::lifecycle::CreateArgs;
use super::remote::Remote;
use super::shell::{self, ShellArgs};
use super::sync::{connector, gzip, Compress};
use crate::sync::{self, Format, Reporter, SyncSpec};

/// The label that ties a sandbox to a local folder: its value is a hash of the folder's
/// canonical path.
const DEV_LABEL: &str = "tether.dev";
/// Where the folder goes in the sandbox unless `--remote-dir` says otherwise.
const DEFAULT_REMOTE_DIR: &str = "/workspace";

/// `tether dev`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  tether dev\n  tether dev ./app --port 3000 --port 8080:80\n  \
                        tether dev --rm --image ./rootfs\n\n\
                        The sandbox is found again by the label tether.dev=<hash of the \
                        folder's path>; `tether ls --label tether.dev=...` shows it."
)]
pub(super) struct DevArgs {
    #[command(flatten)]
    create: CreateArgs,
    /// The folder to work on.
    #[arg(value_name = "LOCAL", default_value = ".")]
    local: PathBuf,
    /// A port inside the sandbox to reach from here, `PORT` or `LOCAL:REMOTE`; repeatable.
    #[arg(long = "port", short = 'p', value_name = "[LOCAL:]REMOTE", value_parser = forward::port_pair)]
    ports: Vec<(u16, u16)>,
    /// Where the folder goes in the sandbox.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_REMOTE_DIR)]
    remote_dir: String,
    /// Leave paths matching this gitignore-style pattern alone; repeatable.
    #[arg(long = "exclude", short = 'x', value_name = "PATTERN")]
    excludes: Vec<String>,
    /// Delete the sandbox when the shell exits, instead of keeping it for next time.
    #[arg(long)]
    rm: bool,
}

pub(super) async fn run(remote: Remote, args: DevArgs) -> anyhow::Result<i32> {
    let local = args
        .local
        .canonicalize()
        .with_context(|| format!("cannot open {}", args.local.display()))?;
    anyhow::ensure!(local.is_dir(), "{} is not a directory", local.display());
    let rest = remote.rest()?;
    let mut req = args.create.request()?;
    req.spec.labels.insert(DEV_LABEL.into(), folder_key(&local));
    req.get_or_create = true;
    let sandbox = rest
        .create(&req)
        .await
        .map_err(|e| remote.explain(e, None))?;
    let id = sandbox.id.clone();
    let verb = if sandbox.created {
        "created"
    } else {
        "reusing"
    };
    eprintln!("{verb} sandbox {id} for {}", local.display());

    let spec = SyncSpec {
        sandbox: id.clone(),
        local,
        remote: args.remote_dir.clone(),
        excludes: args.excludes,
        gzip: gzip(Compress::Auto, &rest),
        modes: Default::default(),
    };
    // The first push in the foreground, so the shell starts on a complete tree.
    let session = rest
        .connect(&id)
        .await
        .map_err(|e| remote.explain(e, Some(&id)))?;
    sync::push(&session, &spec, &Reporter::new(Format::Human)).await?;
    drop(session);
    // The shell owns the terminal from here on: the background sync stays quiet.
    let stop = CancellationToken::new();
    let watching = tokio::spawn(sync::watch(
        connector(rest.clone(), id.clone()),
        spec,
        Reporter::new(Format::Quiet),
        stop.clone(),
    ));
    let link = Link::new(rest.clone(), id.clone());
    let forwards = forward::start(&link, &args.ports).await?;
    for (addr, port) in &forwards.bound {
        eprintln!("forwarding {addr} -> {id}:{port}");
    }

    let code = shell::run(remote.clone(), shell_args(&id, &args.remote_dir)?).await;

    stop.cancel();
    match watching.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!(
            "tether dev: the background sync stopped: {}",
            tether_client::escape::escape_lines(&e.to_string())
        ),
        Err(e) => eprintln!("tether dev: the background sync failed: {e}"),
    }
    drop(forwards);
    if args.rm {
        rest.delete(&id)
            .await
            .map_err(|e| remote.explain(e, Some(&id)))?;
        eprintln!("deleted sandbox {id}");
    } else {
        eprintln!("kept sandbox {id}: `tether dev` here reuses it, `tether rm {id}` deletes it");
    }
    code
}

/// The arguments of `tether shell -w DIR ID`, parsed by the shell command's own grammar.
fn shell_args(id: &str, dir: &str) -> anyhow::Result<ShellArgs> {
    use clap::Args as _;
    let command = ShellArgs::augment_args(clap::Command::new("shell"));
    let matches = command.try_get_matches_from(["shell", "-w", dir, id])?;
    Ok(ShellArgs::from_arg_matches(&matches)?)
}

/// The label value naming a folder: the first 16 hex digits of its path's SHA-256.
fn folder_key(path: &Path) -> String {
    let digest = Sha256::digest(path.as_os_str().as_encoded_bytes());
    hex::encode(&digest[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_get_stable_distinct_keys() {
        let a = folder_key(Path::new("/home/me/app"));
        assert_eq!(a.len(), 16);
        assert_eq!(a, folder_key(Path::new("/home/me/app")));
        assert_ne!(a, folder_key(Path::new("/home/me/app2")));
    }

    #[test]
    fn the_shell_grammar_takes_the_directory() {
        let args = shell_args("sb-1", "/workspace").unwrap();
        assert!(format!("{args:?}").contains("/workspace"));
    }
}
