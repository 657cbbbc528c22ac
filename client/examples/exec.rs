//! Runs a command in a new local sandbox and streams its output as it comes.
//!
//! ```sh
//! tether serve &                                   # a relay on this machine
//! cargo run -p tether-client --example exec -- uname -a
//! ```
//!
//! The relay and token come from `TETHER_RELAY` and `TETHER_TOKEN` (else the local relay and
//! its admin token). The sandbox is deleted at the end, whatever the command did.

use std::io::Write;

use tether_client::api::CreateRequest;
use tether_client::{ProcessEvent, RelayClient};
use tether_proto::op::ExecSpec;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.is_empty() {
        return Err("usage: exec COMMAND [ARG...]".into());
    }
    let relay = RelayClient::from_env()?;
    let sandbox = relay.create(&CreateRequest::default()).await?;
    let result = run(&relay, &sandbox.id, argv).await;
    relay.delete(&sandbox.id).await?;
    let code = result?;
    std::process::exit(code);
}

/// Streams the command's stdout and stderr to ours and returns its exit code.
async fn run(
    relay: &RelayClient,
    id: &str,
    argv: Vec<String>,
) -> Result<i32, Box<dyn std::error::Error>> {
    let session = relay.connect(id).await?;
    let mut process = session.exec(ExecSpec::argv(argv)).await?;
    while let Some(event) = process.next().await {
        match event? {
            ProcessEvent::Stdout(bytes) => std::io::stdout().write_all(&bytes)?,
            ProcessEvent::Stderr(bytes) => std::io::stderr().write_all(&bytes)?,
            ProcessEvent::Dropped { .. } => {}
            ProcessEvent::Exit(status) => return Ok(status.code.unwrap_or(128)),
        }
    }
    Err("the connection closed before the command ended".into())
}
