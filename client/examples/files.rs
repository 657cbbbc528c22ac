//! Files in a sandbox: write, read, list, search and edit, each one round trip to the agent.
//!
//! ```sh
//! tether serve &
//! cargo run -p tether-client --example files
//! ```

use tether_client::api::CreateRequest;
use tether_client::RelayClient;
use tether_proto::op::GrepSpec;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let relay = RelayClient::from_env()?;
    let sandbox = relay.create(&CreateRequest::default()).await?;
    let result = demo(&relay, &sandbox.id).await;
    relay.delete(&sandbox.id).await?;
    result
}

async fn demo(relay: &RelayClient, id: &str) -> Result<(), Box<dyn std::error::Error>> {
    let session = relay.connect(id).await?;
    session.mkdir("/workspace/src").await?;
    session
        .write_file(
            "/workspace/src/main.py",
            b"print('hello')\nprint('world')\n",
        )
        .await?;

    let text = session.read_file("/workspace/src/main.py").await?;
    print!("{}", String::from_utf8_lossy(&text));

    for entry in session.list("/workspace", 2).await? {
        println!("{:>8}  {}", entry.size, entry.path);
    }

    let (matches, _truncated) = session
        .grep(GrepSpec {
            path: "/workspace".into(),
            pattern: "world".into(),
            regex: false,
            ignore_case: false,
            glob: Some("*.py".into()),
            limit: None,
        })
        .await?;
    for m in matches {
        println!("{}:{}: {}", m.path, m.line, m.text);
    }

    let replaced = session
        .edit("/workspace/src/main.py", "world", "sandbox", false)
        .await?;
    println!("{replaced} replacement(s)");
    Ok(())
}
