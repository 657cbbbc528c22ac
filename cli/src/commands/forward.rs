//! `tether forward`: local TCP ports carried to ports inside a sandbox. Each accepted
//! connection becomes one `connect` stream on a shared session (reopened if it drops), and
//! bytes flow both ways unchanged, so HTTP, WebSocket upgrades and any other protocol work,
//! with half-closes passed on.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::JoinSet;

use super::remote::Remote;
use tether_client::{files, ClientError, RawStream, RelayClient, Session};

/// `tether forward`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  tether forward sb-1a2b 3000\n  \
                        tether forward sb-1a2b 8080:80 0:5432\n\n\
                        Listens on 127.0.0.1 only. LOCAL 0 picks a free port; each \
                        `forwarding` line says which.")]
pub(super) struct ForwardArgs {
    /// The sandbox.
    #[arg(value_name = "ID")]
    id: String,
    /// `REMOTE` (the same port here) or `LOCAL:REMOTE`; repeatable.
    #[arg(value_name = "[LOCAL:]REMOTE", required = true, value_parser = port_pair)]
    ports: Vec<(u16, u16)>,
}

pub(super) async fn run(remote: Remote, args: ForwardArgs) -> anyhow::Result<()> {
    let link = Link::new(remote.rest()?, args.id.clone());
    // Fail early, with the relay's sentence, if the sandbox cannot be reached at all.
    link.session()
        .await
        .map_err(|e| remote.explain(e, Some(&args.id)))?;
    let forwards = start(&link, &args.ports).await?;
    for f in &forwards.bound {
        println!("forwarding {} -> {}:{}", f.0, args.id, f.1);
    }
    tokio::signal::ctrl_c()
        .await
        .context("cannot wait for Ctrl-C")?;
    Ok(())
}

/// Running forwards; they stop when this is dropped.
pub(super) struct Forwards {
    /// Each listening address and the remote port it goes to.
    pub bound: Vec<(SocketAddr, u16)>,
    _tasks: JoinSet<()>,
}

/// Binds every `(local, remote)` pair on 127.0.0.1 and starts accepting.
pub(super) async fn start(link: &Link, ports: &[(u16, u16)]) -> anyhow::Result<Forwards> {
    let mut tasks = JoinSet::new();
    let mut bound = Vec::new();
    for &(local, remote) in ports {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, local))
            .await
            .with_context(|| {
                format!(
                    "cannot listen on 127.0.0.1:{local}; is it in use? choose another local port"
                )
            })?;
        bound.push((listener.local_addr()?, remote));
        tasks.spawn(accept(listener, link.clone(), remote));
    }
    Ok(Forwards {
        bound,
        _tasks: tasks,
    })
}

async fn accept(listener: TcpListener, link: Link, port: u16) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((socket, _)) = listener.accept().await else {
            continue;
        };
        let _ = socket.set_nodelay(true);
        let link = link.clone();
        connections.spawn(async move {
            if let Err(e) = carry(&link, port, socket).await {
                eprintln!(
                    "tether forward: a connection to {}:{port} failed: {e}",
                    link.id
                );
            }
        });
        // Reap finished connections so the set does not grow with every one ever made.
        while connections.try_join_next().is_some() {}
    }
}

async fn carry(link: &Link, port: u16, socket: TcpStream) -> Result<(), ClientError> {
    let stream = link.connect_port(port).await?;
    files::splice(stream, socket).await
}

/// One session to a sandbox, shared by every connection and reopened when it drops.
#[derive(Clone)]
pub(super) struct Link {
    rest: RelayClient,
    id: String,
    session: Arc<Mutex<Option<Session>>>,
}

impl Link {
    /// A link to sandbox `id`; nothing is opened yet.
    pub(super) fn new(rest: RelayClient, id: String) -> Link {
        Link {
            rest,
            id,
            session: Arc::default(),
        }
    }

    /// The live session, opened or reopened as needed.
    pub(super) async fn session(&self) -> Result<Session, ClientError> {
        let mut slot = self.session.lock().await;
        match &*slot {
            Some(s) if !s.is_closed() => Ok(s.clone()),
            _ => {
                let s = self.rest.connect(&self.id).await?;
                *slot = Some(s.clone());
                Ok(s)
            }
        }
    }

    /// A `connect` stream to `port`, retried once on a fresh session if the old one died.
    async fn connect_port(&self, port: u16) -> Result<RawStream, ClientError> {
        match self.session().await?.connect_port(port).await {
            Err(ClientError::Disconnected) => self.session().await?.connect_port(port).await,
            other => other,
        }
    }
}

/// Parses `REMOTE` or `LOCAL:REMOTE`.
pub(super) fn port_pair(s: &str) -> Result<(u16, u16), String> {
    let port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| format!("`{p}` is not a port number (0-65535)"))
    };
    match s.split_once(':') {
        Some((local, remote)) => Ok((port(local)?, port(remote)?)),
        None => {
            let p = port(s)?;
            Ok((p, p))
        }
    }
    .and_then(|(l, r)| match r {
        0 => Err("the remote port cannot be 0".into()),
        _ => Ok((l, r)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_pair_up() {
        assert_eq!(port_pair("3000").unwrap(), (3000, 3000));
        assert_eq!(port_pair("8080:80").unwrap(), (8080, 80));
        assert_eq!(port_pair("0:5432").unwrap(), (0, 5432));
        assert!(port_pair("80:0").is_err());
        assert!(port_pair("x").is_err());
        assert!(port_pair("1:2:3").is_err());
    }
}
