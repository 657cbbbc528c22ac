//! Why a tool call failed: [`ToolError`], each variant with the typed reason (`code`) an MCP
//! host sees in the error result, and a sentence saying what to do.

use rmcp::model::CallToolResult;
use serde_json::json;

use tether_client::hostfs::HostFsError;
use tether_client::ClientError;

/// A failed tool call. It reaches the MCP client as a tool result with `isError: true`
/// and `{"error": {"code", "message"}}` as its structured content.
#[derive(Debug, thiserror::Error)]
pub(super) enum ToolError {
    /// An argument is missing, malformed or out of range.
    #[error("{0}")]
    InvalidArgument(String),
    /// A host path lies outside every `--allow-dir`, or could reach outside one.
    #[error("{0}")]
    PathNotAllowed(String),
    /// No exec session has this id in this server.
    #[error(
        "no exec session {0} in this server: it never existed, was forgotten to make room, or \
         the server restarted; start one with exec_start"
    )]
    SessionNotFound(String),
    /// The server holds as many exec sessions as it may, all running.
    #[error(
        "{0} exec sessions are running, the most this server keeps; end one (exec_signal \
         with KILL) and poll it to its exit, then retry"
    )]
    TooManySessions(usize),
    /// The exec session's process has ended or its input was closed.
    #[error("{0}")]
    SessionEnded(String),
    /// The file holds binary data, which the text tools do not return.
    #[error("{0}")]
    BinaryFile(String),
    /// The relay or the sandbox's agent refused or failed the operation.
    #[error("{}", crate::advice::sentence(.0, None))]
    Client(#[from] ClientError),
    /// Landing what the sandbox sent on this machine failed or was refused.
    #[error("{0}")]
    HostFs(#[from] HostFsError),
    /// A file operation on this machine failed.
    #[error("{0}")]
    HostIo(String),
    /// The connection to the sandbox was lost during the operation.
    #[error("{0}")]
    Disconnected(String),
    /// The operation took longer than it may.
    #[error("{0}")]
    Timeout(String),
}

impl ToolError {
    /// The machine-readable reason. Errors from the agent keep their wire code
    /// (`not_found`, `permission_denied`, ...), errors from the relay their REST code.
    pub(super) fn code(&self) -> String {
        match self {
            ToolError::InvalidArgument(_) => "invalid_argument".into(),
            ToolError::PathNotAllowed(_) => "path_not_allowed".into(),
            ToolError::SessionNotFound(_) => "session_not_found".into(),
            ToolError::TooManySessions(_) => "too_many_sessions".into(),
            ToolError::SessionEnded(_) => "session_ended".into(),
            ToolError::BinaryFile(_) => "binary_file".into(),
            ToolError::Client(e) => client_code(e),
            ToolError::HostFs(HostFsError::Remote(e)) => client_code(e),
            ToolError::HostFs(_) => "host_fs_refused".into(),
            ToolError::HostIo(_) => "host_io".into(),
            ToolError::Disconnected(_) => "disconnected".into(),
            ToolError::Timeout(_) => "timeout".into(),
        }
    }

    /// The tool result that reports this error.
    pub(super) fn into_result(self) -> CallToolResult {
        CallToolResult::structured_error(json!({
            "error": { "code": self.code(), "message": self.to_string() }
        }))
    }
}

fn client_code(e: &ClientError) -> String {
    match e {
        ClientError::Remote { code, .. } => code.as_str().into(),
        ClientError::Http { code, .. } => code.clone(),
        ClientError::Connect { .. } => "relay_unreachable".into(),
        ClientError::Interrupted { .. } => "relay_went_away".into(),
        ClientError::NotRelay { .. } => "not_a_relay".into(),
        ClientError::Tls { .. } => "tls_failed".into(),
        ClientError::CaCert(_) => "invalid_ca_cert".into(),
        ClientError::Disconnected => "disconnected".into(),
        ClientError::PeerSilent { .. } => "peer_silent".into(),
        ClientError::Protocol(_) => "protocol_error".into(),
        ClientError::Local(_) => "host_io".into(),
    }
}

/// Shorthand for an [`ToolError::InvalidArgument`].
pub(super) fn invalid(message: impl Into<String>) -> ToolError {
    ToolError::InvalidArgument(message.into())
}
