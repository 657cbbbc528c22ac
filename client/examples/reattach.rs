//! A background process outlives its connection: start it, drop the session, reconnect and
//! re-attach from the byte offsets already seen; the agent replays what was missed.
//!
//! ```sh
//! tether serve &
//! cargo run -p tether-client --example reattach
//! ```

use std::time::Duration;

use tether_client::api::CreateRequest;
use tether_client::{ProcessEvent, RelayClient};
use tether_proto::op::ExecSpec;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let relay = RelayClient::from_env()?;
    let sandbox = relay.create(&CreateRequest::default()).await?;
    let result = demo(&relay, &sandbox.id).await;
    relay.delete(&sandbox.id).await?;
    result
}

async fn demo(relay: &RelayClient, id: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut spec = ExecSpec::shell("for i in 1 2 3 4 5; do echo tick $i; sleep 0.2; done");
    spec.background = true;

    let session = relay.connect(id).await?;
    let mut process = session.exec(spec).await?;
    let handle = process.process;
    // Read the first line, then go away as a dropped network would.
    if let Some(ProcessEvent::Stdout(bytes)) = process.next().await.transpose()? {
        print!("before: {}", String::from_utf8_lossy(&bytes));
    }
    let offsets = process.offsets();
    drop(process);
    drop(session);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let session = relay.connect(id).await?;
    let mut process = session.attach(handle, offsets, false).await?;
    while let Some(event) = process.next().await {
        match event? {
            ProcessEvent::Stdout(bytes) => print!("after:  {}", String::from_utf8_lossy(&bytes)),
            ProcessEvent::Exit(status) => println!("exit {:?}", status.code),
            _ => {}
        }
    }
    Ok(())
}
