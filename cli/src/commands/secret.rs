//! `tether secret`: the relay's secret store (set, list, rm). A value is read from stdin, never
//! from an argument (which `ps` and shell history would show), and is never printed.

use std::io::{BufRead, Read, Write};

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use tether_client::api::{
    check_secret_name, check_secret_value, SecretValue, MAX_SECRET_VALUE_BYTES,
};

use super::output::{self, Table};
use super::remote::Remote;
use super::terminal::EchoOff;

/// `tether secret ...`.
#[derive(Debug, Subcommand)]
pub(super) enum SecretCommand {
    /// Store a secret in the relay, its value read from stdin (hidden on a terminal), for
    /// sandboxes created with `--secret NAME@HOST`.
    Set(SetArgs),
    /// List the stored secrets: names and times, never values.
    List(ListArgs),
    /// Delete stored secrets.
    Rm(RmArgs),
}

/// `tether secret set`.
#[derive(Debug, Args)]
pub(super) struct SetArgs {
    /// The secret's name, which is also the environment variable sandboxes see it under.
    #[arg(value_name = "NAME")]
    name: String,
    /// Another tenant's store (the relay's admin token only).
    #[arg(long, value_name = "TENANT")]
    tenant: Option<String>,
}

/// `tether secret list`.
#[derive(Debug, Args)]
pub(super) struct ListArgs {
    /// Another tenant's store (the relay's admin token only).
    #[arg(long, value_name = "TENANT")]
    tenant: Option<String>,
    /// Print the list as JSON.
    #[arg(long)]
    json: bool,
}

/// `tether secret rm`.
#[derive(Debug, Args)]
pub(super) struct RmArgs {
    /// The secrets to delete.
    #[arg(value_name = "NAME", required = true)]
    names: Vec<String>,
    /// Another tenant's store (the relay's admin token only).
    #[arg(long, value_name = "TENANT")]
    tenant: Option<String>,
}

pub(super) async fn run(remote: Remote, cmd: SecretCommand) -> anyhow::Result<()> {
    match cmd {
        SecretCommand::Set(args) => set(remote, args).await,
        SecretCommand::List(args) => list(remote, args).await,
        SecretCommand::Rm(args) => rm(remote, args).await,
    }
}

async fn set(remote: Remote, args: SetArgs) -> anyhow::Result<()> {
    // Before the value is typed: a bad name should not cost the user a paste.
    check_secret_name(&args.name).map_err(|e| anyhow!(e))?;
    let rest = remote.rest()?;
    let value = read_value(&args.name).await?;
    let stored = rest
        .set_secret(&args.name, &value, args.tenant.as_deref())
        .await
        .map_err(|e| remote.explain(e, None))?;
    eprintln!(
        "stored secret {} for tenant {}",
        stored.name,
        tether_client::escape::escape_str(&stored.tenant)
    );
    Ok(())
}

async fn list(remote: Remote, args: ListArgs) -> anyhow::Result<()> {
    let rest = remote.rest()?;
    let secrets = rest
        .secrets(args.tenant.as_deref())
        .await
        .map_err(|e| remote.explain(e, None))?;
    if args.json {
        return output::json(&secrets);
    }
    let now = output::now_ms();
    let mut table = Table::new(&["NAME", "CREATED", "UPDATED"]);
    for s in &secrets {
        table.row(vec![
            s.name.clone(),
            output::age(s.created_ms, now),
            output::age(s.updated_ms, now),
        ]);
    }
    table.print()
}

async fn rm(remote: Remote, args: RmArgs) -> anyhow::Result<()> {
    let rest = remote.rest()?;
    let mut failed = 0;
    for name in &args.names {
        match rest.delete_secret(name, args.tenant.as_deref()).await {
            Ok(()) => eprintln!("deleted secret {name}"),
            Err(e) => {
                eprintln!("tether: {}", remote.explain(e, None));
                failed += 1;
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} secrets not deleted", args.names.len());
    }
    Ok(())
}

/// The value on stdin. On a terminal: a prompt on stderr, echo off, one line. Otherwise
/// everything up to end of file. One trailing newline is dropped either way (what `echo` and
/// an editor add); an empty value is refused.
async fn read_value(name: &str) -> anyhow::Result<SecretValue> {
    let echo_off = EchoOff::enter().context("cannot turn off the terminal's echo")?;
    let interactive = echo_off.is_some();
    if interactive {
        eprint!("value of secret {name} (not shown; end with Enter): ");
        let _ = std::io::stderr().flush();
    }
    // Read on a thread of its own so that Ctrl-C can end the wait with the terminal restored
    // (the guard is dropped here, not in the blocked thread).
    let reader = tokio::task::spawn_blocking(move || read_stdin(interactive));
    let read = tokio::select! {
        read = reader => read.context("the task reading stdin failed")?,
        _ = tokio::signal::ctrl_c() => {
            drop(echo_off);
            eprintln!();
            bail!("interrupted: no secret was stored");
        }
    };
    drop(echo_off);
    if interactive {
        eprintln!();
    }
    value_from(name, read?)
}

/// The value in `bytes` as read from stdin: one trailing newline (`\n` or `\r\n`) dropped;
/// refused when empty, too long, not UTF-8, or holding a NUL byte.
fn value_from(name: &str, mut bytes: Vec<u8>) -> anyhow::Result<SecretValue> {
    if bytes.len() > MAX_SECRET_VALUE_BYTES + 2 {
        bail!(
            "the value of secret {name} is longer than {MAX_SECRET_VALUE_BYTES} bytes (64 KiB), \
             the most a secret holds"
        );
    }
    if bytes.ends_with(b"\n") {
        bytes.pop();
        if bytes.ends_with(b"\r") {
            bytes.pop();
        }
    }
    if bytes.is_empty() {
        bail!(
            "the value of secret {name} is empty: give it on stdin, e.g. \
             `printf %s \"$VALUE\" | tether secret set {name}`, or type it when asked"
        );
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        anyhow!(
            "the value of secret {name} is not UTF-8 text; a secret is text (encode a binary \
             value, with base64 for instance)"
        )
    })?;
    check_secret_value(name, &text).map_err(|e| anyhow!(e))?;
    Ok(SecretValue::new(text))
}

/// Stdin's bytes: one line from a terminal, else all of it, up to a little more than the
/// largest value (so an oversized one is reported, not read to the end).
fn read_stdin(one_line: bool) -> anyhow::Result<Vec<u8>> {
    // The value, a "\r\n", and one byte to tell "too long" from "exactly the limit".
    let limit = (MAX_SECRET_VALUE_BYTES + 3) as u64;
    let mut bytes = Vec::new();
    let mut stdin = std::io::stdin().lock().take(limit);
    if one_line {
        stdin.read_until(b'\n', &mut bytes)
    } else {
        stdin.read_to_end(&mut bytes)
    }
    .context("cannot read the secret's value from stdin")?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(bytes: &[u8]) -> anyhow::Result<String> {
        value_from("KEY", bytes.to_vec()).map(|v| v.expose().to_string())
    }

    #[test]
    fn one_trailing_newline_is_dropped_and_no_more() {
        assert_eq!(value(b"sk-1\n").unwrap(), "sk-1");
        assert_eq!(value(b"sk-1\r\n").unwrap(), "sk-1");
        assert_eq!(value(b"sk-1").unwrap(), "sk-1");
        assert_eq!(value(b"sk-1\n\n").unwrap(), "sk-1\n");
        assert_eq!(
            value(b" a b \n").unwrap(),
            " a b ",
            "spaces are the value's"
        );
    }

    #[test]
    fn empty_binary_oversized_and_nul_values_are_refused_without_quoting_them() {
        for (bytes, words) in [
            (b"".to_vec(), "empty"),
            (b"\n".to_vec(), "printf"),
            (b"\xff\xfe-secret".to_vec(), "UTF-8"),
            (b"a\0-secret".to_vec(), "NUL"),
            (vec![b'x'; MAX_SECRET_VALUE_BYTES + 3], "64 KiB"),
            (vec![b'x'; MAX_SECRET_VALUE_BYTES + 1], "64 KiB"),
        ] {
            let err = value(&bytes).unwrap_err().to_string();
            assert!(err.contains(words), "{words}: {err}");
            assert!(
                !err.contains("secret\"") && !err.contains("-secret"),
                "{err}"
            );
        }
        assert!(value(&vec![b'x'; MAX_SECRET_VALUE_BYTES]).is_ok());
        let mut exact = vec![b'x'; MAX_SECRET_VALUE_BYTES];
        exact.extend(b"\r\n");
        assert!(value(&exact).is_ok(), "the limit, then a newline");
    }
}
