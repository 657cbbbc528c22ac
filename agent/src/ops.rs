//! Routes each opened stream to the module that owns its operation.

use std::sync::Arc;

use tether_proto::op::Op;

use crate::agent::Agent;
use crate::stream::{OpResult, StreamCtx};
use crate::{exec, files, forward, info};

/// Runs `op` on its stream until the operation is finished.
pub(crate) async fn run(ctx: StreamCtx, op: Op, agent: Arc<Agent>) -> OpResult {
    match op {
        Op::Exec(_) | Op::Attach { .. } | Op::Wait { .. } | Op::Kill { .. } | Op::Processes => {
            exec::run(ctx, op, agent).await
        }
        Op::Connect { port, host } => forward::connect(ctx, host, port).await,
        Op::Ports => forward::ports(ctx).await,
        Op::Info => info::run(ctx, &agent).await,
        Op::Read { .. }
        | Op::Write(_)
        | Op::Stat { .. }
        | Op::List { .. }
        | Op::Mkdir { .. }
        | Op::Remove { .. }
        | Op::Rename { .. }
        | Op::Chmod { .. }
        | Op::Glob { .. }
        | Op::Grep(_)
        | Op::Edit { .. }
        | Op::WriteBatch { .. }
        | Op::ReadBatch { .. }
        | Op::TarRead { .. }
        | Op::TarWrite { .. }
        | Op::Watch { .. } => files::run(ctx, op, agent).await,
    }
}
