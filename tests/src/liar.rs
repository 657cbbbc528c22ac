//! A lying agent: a WebSocket server speaking the agent's side of the protocol (built from
//! the proto crate) that answers each operation from a script instead of a filesystem, so
//! tests can play a hostile sandbox: listings with `..` and absolute paths, tar streams
//! with symlink swaps and hard links, sizes that are lies.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;

use tether_client::Session;
use tether_proto::limits::DATA_CHUNK;
use tether_proto::op::{Op, Reply};
use tether_proto::{frame, Channel, Control, ErrorCode, Frame, StreamId, PROTOCOL_VERSION};

/// One thing the liar says on a stream, in order; the stream then ends (`eof` on `out` if
/// data was sent, then `closed`).
#[derive(Clone, Debug)]
pub enum Say {
    /// A `reply`.
    Reply(Reply),
    /// Bytes on `out`, split into frames.
    Out(Vec<u8>),
    /// An `error` (which closes the stream).
    Fail(ErrorCode, String),
}

/// What the liar answers to an operation.
pub(crate) type Script = dyn Fn(&Op) -> Vec<Say> + Send + Sync;

/// A lying agent on an ephemeral loopback port; stops when dropped.
pub struct Liar {
    /// `ws://127.0.0.1:PORT`.
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Liar {
    /// Starts serving `script` to every connection.
    pub async fn start(script: impl Fn(&Op) -> Vec<Say> + Send + Sync + 'static) -> Liar {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let url = format!("ws://{}", listener.local_addr().expect("local addr"));
        let script: Arc<Script> = Arc::new(script);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let script = script.clone();
                tokio::spawn(async move {
                    if let Ok(ws) = tokio_tungstenite::accept_async(tcp).await {
                        serve(ws, script).await;
                    }
                });
            }
        });
        Liar { url, task }
    }

    /// A client session to it.
    pub async fn session(&self) -> Session {
        Session::connect(&self.url, None)
            .await
            .expect("connect to the lying agent")
    }
}

impl Drop for Liar {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(ws: tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>, script: Arc<Script>) {
    let (mut sink, mut source) = ws.split();
    while let Some(Ok(msg)) = source.next().await {
        let Message::Binary(bytes) = msg else {
            continue;
        };
        let Ok(Frame::Control(control)) = Frame::decode(bytes) else {
            continue;
        };
        let frames = match control {
            Control::Hello { .. } => vec![frame::encode_control(&Control::Welcome {
                protocol: PROTOCOL_VERSION,
                agent_version: "liar".into(),
                capabilities: Vec::new(),
            })],
            Control::Open { stream, op, .. } => answer(stream, &script(&op)),
            _ => Vec::new(),
        };
        for f in frames {
            if sink.send(Message::Binary(f)).await.is_err() {
                return;
            }
        }
    }
}

fn answer(stream: StreamId, says: &[Say]) -> Vec<Bytes> {
    let mut frames = Vec::new();
    let mut sent_out = false;
    for say in says {
        match say {
            Say::Reply(reply) => frames.push(frame::encode_control(&Control::Reply {
                stream,
                reply: reply.clone(),
            })),
            Say::Out(data) => {
                sent_out = true;
                for chunk in data.chunks(DATA_CHUNK) {
                    frames.push(frame::encode_data(stream, Channel::Out, chunk));
                }
            }
            Say::Fail(code, message) => {
                frames.push(frame::encode_control(&Control::Error {
                    stream: Some(stream),
                    code: *code,
                    message: message.clone(),
                }));
                frames.push(frame::encode_control(&Control::Closed { stream }));
                return frames;
            }
        }
    }
    if sent_out {
        frames.push(frame::encode_control(&Control::Eof {
            stream,
            channel: Channel::Out,
        }));
    }
    frames.push(frame::encode_control(&Control::Closed { stream }));
    frames
}
