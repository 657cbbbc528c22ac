//! Admitting connections and requests only while file descriptors last: the accept loop's
//! listener, which survives `EMFILE` without the one-second stall of the stock one, and the
//! middleware that answers 503 to any request arriving with too few descriptors left.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio::net::{TcpListener, TcpStream};
use tracing::warn;

use super::fds::FdBudget;
use tether_client::api::{ErrorBody, ErrorDetail};

/// How long the accept loop waits before trying again when no descriptor is free at all,
/// not even the spare: the connection waits in the kernel's backlog meanwhile.
const EXHAUSTED_RETRY: Duration = Duration::from_millis(50);
/// How long it waits after an accept error that is not about descriptors or the peer.
const ERROR_RETRY: Duration = Duration::from_millis(200);

/// The relay's listener: sets `TCP_NODELAY` on every connection, and when `accept` fails for
/// want of a descriptor, releases the budget's spare one so the connection gets its 503.
pub(super) struct Admitting {
    listener: TcpListener,
    budget: Arc<FdBudget>,
}

impl Admitting {
    pub(super) fn new(listener: TcpListener, budget: Arc<FdBudget>) -> Admitting {
        Admitting { listener, budget }
    }
}

impl axum::serve::Listener for Admitting {
    type Io = TcpStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (TcpStream, std::net::SocketAddr) {
        let mut warned = false;
        loop {
            match self.listener.accept().await {
                Ok((tcp, addr)) => {
                    // Interactive traffic: never hold a small write back waiting for more.
                    if let Err(e) = tcp.set_nodelay(true) {
                        warn!("cannot set TCP_NODELAY on a client connection: {e}");
                    }
                    self.budget.rearm_spare();
                    return (tcp, addr);
                }
                Err(e) if out_of_descriptors(&e) => {
                    if !warned {
                        warn!("cannot accept a connection: {e}; refusing new work until descriptors free up");
                        warned = true;
                    }
                    // With the spare closed, the next accept gets a descriptor, and the
                    // middleware (unable to count) answers that connection with 503.
                    if !self.budget.release_spare() {
                        tokio::time::sleep(EXHAUSTED_RETRY).await;
                    }
                }
                Err(e) if peer_error(&e) => {}
                Err(e) => {
                    warn!("cannot accept a connection: {e}");
                    tokio::time::sleep(ERROR_RETRY).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }
}

/// Middleware: refuses a request with 503 when too few descriptors are left to serve it.
pub(super) async fn refuse_when_short(
    State(budget): State<Arc<FdBudget>>,
    request: Request,
    next: Next,
) -> Response {
    match budget.admit() {
        Ok(()) => next.run(request).await,
        Err(shortage) => {
            let body = ErrorBody {
                error: ErrorDetail {
                    code: "unavailable".into(),
                    message: shortage.to_string(),
                },
            };
            let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
            // The connection's descriptor is better given back than kept alive.
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
            response
        }
    }
}

fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

fn peer_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
