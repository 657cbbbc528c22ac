"""Tether's Python SDK: sandboxes on a Tether relay, driven from Python.

# Layout

- ``_sandbox.AsyncSandbox`` is the SDK: lifecycle over the relay's REST API (``_relay``),
  everything inside the sandbox over one WebSocket (``_protocol``, the only module that
  touches frames). It hands out ``commands`` (``_commands``), ``files`` (``_files``, with
  ``_tar`` for host-side archives), ``pty`` (``_pty``), ``ports`` (``_ports``) and code
  (``_code``, whose stateful session runs ``_code_driver`` inside the sandbox).
- ``_sync.Sandbox`` (with ``_sync_handles``) is the blocking twin: each call runs the async
  one on a private event loop thread (``_portal``), so both share every line of logic and
  every result type (``types``).
- ``errors`` holds the exception hierarchy and the one mapping from relay statuses and agent
  error codes to it.

Quick start::

    from tether_sandbox import Sandbox

    with Sandbox.create(labels={"thread": "42"}, ttl=1800) as sb:
        print(sb.commands.run("echo hi; exit 3").exit_code)   # 3
        sb.files.write("/workspace/a.txt", "hello")
        print(sb.files.read_text("/workspace/a.txt"))
        sb.delete()
"""

from ._code import AsyncCodeSession
from ._commands import AsyncCommandHandle, AsyncCommands
from ._files import AsyncFiles, AsyncWatch
from ._ports import AsyncForward, AsyncPorts
from ._pty import AsyncPty, AsyncPtyHandle
from ._relay import RelayConfig
from ._sandbox import AsyncSandbox
from ._sync import Commands, Files, Ports, Pty, Sandbox
from ._sync_handles import CodeSession, CommandHandle, Forward, PtyHandle, Watch
from .errors import (
    AgentError,
    AgentInternalError,
    AgentTimeout,
    AlreadyExists,
    AuthenticationError,
    CodeSessionError,
    CommandFailed,
    CommandTimeout,
    Conflict,
    ConnectionLost,
    Forbidden,
    InvalidArgument,
    InvalidPath,
    InvalidRequest,
    IsADirectory,
    NotADirectory,
    NotFound,
    PermissionDenied,
    ProtocolError,
    ProviderUnsupported,
    RateLimited,
    RelayError,
    RelayUnavailable,
    RelayUnreachable,
    SandboxGone,
    SandboxNotFound,
    SandboxPaused,
    TemplateNotBuilt,
    TetherError,
    TooLarge,
    Unauthorized,
    Unsupported,
)
from .types import (
    AgentInfo,
    CodeError,
    CodeResult,
    CommandResult,
    ExitStatus,
    FileEvent,
    FileInfo,
    GlobResult,
    GrepMatch,
    GrepResult,
    IdleAction,
    ListeningPort,
    NetworkInfo,
    OutputChunk,
    ProcessInfo,
    ReadResult,
    SandboxCapabilities,
    SandboxInfo,
    Secret,
    SecretBinding,
    WriteResult,
)

__version__ = "0.1.0"

__all__ = [
    "AgentError",
    "AgentInfo",
    "AgentInternalError",
    "AgentTimeout",
    "AlreadyExists",
    "AsyncCodeSession",
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncForward",
    "AsyncPorts",
    "AsyncPty",
    "AsyncPtyHandle",
    "AsyncSandbox",
    "AsyncWatch",
    "AuthenticationError",
    "CodeError",
    "CodeResult",
    "CodeSession",
    "CodeSessionError",
    "CommandFailed",
    "CommandHandle",
    "CommandResult",
    "CommandTimeout",
    "Commands",
    "Conflict",
    "ConnectionLost",
    "ExitStatus",
    "FileEvent",
    "FileInfo",
    "Files",
    "Forbidden",
    "Forward",
    "GlobResult",
    "GrepMatch",
    "GrepResult",
    "IdleAction",
    "InvalidArgument",
    "InvalidPath",
    "InvalidRequest",
    "IsADirectory",
    "ListeningPort",
    "NetworkInfo",
    "NotADirectory",
    "NotFound",
    "OutputChunk",
    "PermissionDenied",
    "Ports",
    "ProcessInfo",
    "ProtocolError",
    "ProviderUnsupported",
    "Pty",
    "PtyHandle",
    "RateLimited",
    "ReadResult",
    "RelayConfig",
    "RelayError",
    "RelayUnavailable",
    "RelayUnreachable",
    "Sandbox",
    "SandboxCapabilities",
    "SandboxGone",
    "SandboxInfo",
    "SandboxNotFound",
    "SandboxPaused",
    "Secret",
    "SecretBinding",
    "TemplateNotBuilt",
    "TetherError",
    "TooLarge",
    "Unauthorized",
    "Unsupported",
    "Watch",
    "WriteResult",
]
