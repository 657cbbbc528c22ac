//! PLACEHOLDER until the files owner replaces it.
use crate::agent::Agent;
use crate::stream::{OpError, OpResult, StreamCtx};
use std::sync::Arc;
use tether_proto::{op::Op, ErrorCode};

/// Runs a file operation.
pub async fn run(_ctx: StreamCtx, _op: Op, _agent: Arc<Agent>) -> OpResult {
    Err(OpError::new(ErrorCode::Unsupported, "not yet"))
}
