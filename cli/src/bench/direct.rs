//! The same sandbox without the relay (`tether bench --direct`): a second agent in the bench's
//! sandbox, the same binary under the same limits, serving a Unix socket in the sandbox's
//! `/tmp` (`tether-agent serve --listen-unix`), which the bench reaches on the host through the
//! sandbox's disk. The figures measured both ways then differ by the relay alone.
//!
//! Only for a local sandbox of the bench's private relay: the bench knows where its disk is
//! (`<data-dir>/local/<id>/disk/tmp` is the sandbox's `/tmp`) and where its agent binary is
//! (`/.tether/tether-agent` inside).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use rand::RngCore;
use tether_client::{Process, Session};
use tether_proto::op::ExecSpec;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

/// The agent binary inside a local sandbox.
const AGENT_IN_SANDBOX: &str = "/.tether/tether-agent";
/// The second agent's socket and token, in the sandbox's `/tmp`.
const SOCKET: &str = "tether-bench-direct.sock";
const TOKEN: &str = "tether-bench-direct.token";
/// How long the second agent may take to listen.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest message either side sends: twice the largest frame, as every client allows.
const MAX_MESSAGE: usize =
    2 * (tether_proto::limits::MAX_PAYLOAD + tether_proto::limits::HEADER_LEN);

/// A session straight to an agent in the sandbox, and that agent.
pub(super) struct Direct {
    /// The session, through no relay.
    pub session: Session,
    /// The second agent, run through the relayed session.
    agent: Process,
    /// Its socket on the host.
    socket: PathBuf,
}

impl Direct {
    /// Starts a second agent in sandbox `id` through `relayed`, and connects to it. `data_dir`
    /// is the private relay's data directory.
    pub(super) async fn open(
        relayed: &Session,
        data_dir: &Path,
        id: &str,
    ) -> anyhow::Result<Direct> {
        let host_tmp = data_dir.join("local").join(id).join("disk").join("tmp");
        anyhow::ensure!(
            host_tmp.is_dir(),
            "{} is not there: --direct measures a local sandbox of the bench's own relay",
            host_tmp.display()
        );
        let socket = host_tmp.join(SOCKET);
        let _ = std::fs::remove_file(&socket);
        let mut secret = [0u8; 32];
        rand::rng().fill_bytes(&mut secret);
        let token = hex::encode(secret);
        relayed
            .write_file(format!("/tmp/{TOKEN}"), token.as_bytes())
            .await
            .context("cannot give the second agent its token")?;
        let mut spec = ExecSpec::argv([
            AGENT_IN_SANDBOX,
            "serve",
            "--listen-unix",
            &format!("/tmp/{SOCKET}"),
            "--token-file",
            &format!("/tmp/{TOKEN}"),
        ]);
        spec.background = true;
        let agent = relayed
            .exec(spec)
            .await
            .context("cannot start a second agent in the sandbox")?;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        while !socket.exists() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the second agent did not listen on {} within {READY_TIMEOUT:?}",
                socket.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let session = connect(&socket, &token)
            .await
            .with_context(|| format!("cannot connect to {}", socket.display()))?;
        Ok(Direct {
            session,
            agent,
            socket,
        })
    }

    /// Stops the second agent and removes its socket.
    pub(super) async fn close(self, relayed: &Session) {
        drop(self.session);
        let _ = relayed.kill(self.agent.process, None, false).await;
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// A protocol session over the Unix socket at `path`, presenting `token`.
async fn connect(path: &Path, token: &str) -> anyhow::Result<Session> {
    let stream = tokio::net::UnixStream::connect(path).await?;
    let mut request = "ws://agent/".into_client_request()?;
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse()?);
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    let (ws, _) =
        tokio_tungstenite::client_async_with_config(request, stream, Some(config)).await?;
    Ok(Session::handshake(ws).await?)
}
