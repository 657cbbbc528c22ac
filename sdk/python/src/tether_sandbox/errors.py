"""The SDK's exceptions, and the one place that maps relay statuses and agent error codes
to them.

Every exception is a :class:`TetherError`. Three families sit under it: the relay refused a
REST call or a connection (:class:`RelayError`), the agent refused an operation
(:class:`AgentError`, one subclass per protocol error code), or the connection itself broke
(:class:`ConnectionLost`, :class:`ProtocolError`).
"""

from __future__ import annotations


class TetherError(Exception):
    """Base class of every error this SDK raises."""


# --- the relay ---------------------------------------------------------------------------


class RelayError(TetherError):
    """The relay answered a request with an error.

    ``status`` is the HTTP status (0 when the relay could not be reached) and ``code`` the
    relay's machine-readable code (``not_found``, ``unauthorized``, ...).
    """

    def __init__(self, message: str, *, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class RelayUnreachable(RelayError):
    """No relay answers at the configured address."""


class AuthenticationError(RelayError):
    """The relay does not know the API token (HTTP 401)."""


class Forbidden(RelayError):
    """The token's role or the relay's policy does not allow the request (HTTP 403)."""


class InvalidRequest(RelayError):
    """The relay refused the request's contents (HTTP 400): the message names the field."""


class SandboxNotFound(RelayError):
    """The relay knows no such sandbox for this token's tenant (HTTP 404)."""


class SandboxGone(RelayError):
    """The relay deleted the sandbox on its own: TTL, idle timeout, or it died (HTTP 410)."""


class Conflict(RelayError):
    """The request conflicts with the sandbox's state (HTTP 409, ``conflict``): resuming a
    sandbox that is not paused, for one."""


class SandboxPaused(Conflict):
    """The sandbox is paused, and the request needs it running: pausing it again, or reaching
    it (a command, a file) when it was created with ``auto_resume=False``. ``resume()`` runs it
    again."""


class ProviderUnsupported(RelayError):
    """The sandbox's provider cannot do what was asked (HTTP 501, ``unsupported``): pausing a
    sandbox, or ``on_idle="pause"``, on a provider without pause. Retrying cannot help."""


class RateLimited(RelayError):
    """The relay kept refusing with HTTP 429 after every retry."""


class RelayUnavailable(RelayError):
    """The relay or its provider failed (HTTP 5xx) after every retry."""


# --- the agent ---------------------------------------------------------------------------


class AgentError(TetherError):
    """The agent inside the sandbox refused or failed an operation.

    ``code`` is the protocol's error code (``not_found``, ``permission_denied``, ...);
    the message is the agent's, which names the path or process concerned.
    """

    code = "internal"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class NotFound(AgentError):
    """A path, process or port does not exist (``not_found``)."""

    code = "not_found"


class PermissionDenied(AgentError):
    """The sandbox user may not do this (``permission_denied``)."""

    code = "permission_denied"


class IsADirectory(AgentError):
    """A file was expected and a directory was found (``is_directory``)."""

    code = "is_directory"


class NotADirectory(AgentError):
    """A directory was expected (``not_a_directory``)."""

    code = "not_a_directory"


class AlreadyExists(AgentError):
    """The target exists and the request said not to replace it (``already_exists``)."""

    code = "already_exists"


class InvalidPath(AgentError):
    """A path is empty or contains NUL (``invalid_path``)."""

    code = "invalid_path"


class InvalidArgument(AgentError):
    """A request field is out of range or inconsistent (``invalid_argument``)."""

    code = "invalid_argument"


class AgentTimeout(AgentError):
    """An operation with its own deadline did not finish (``timeout``)."""

    code = "timeout"


class TooLarge(AgentError):
    """A result or file is too large, or the sandbox's disk is full (``too_large``)."""

    code = "too_large"


class Unauthorized(AgentError):
    """The agent refused the connection's token (``unauthorized``)."""

    code = "unauthorized"


class Unsupported(AgentError):
    """The agent does not support this operation or protocol version (``unsupported``)."""

    code = "unsupported"


class AgentInternalError(AgentError):
    """The agent hit a bug or an unexpected condition (``internal``)."""

    code = "internal"


_AGENT_ERRORS: dict[str, type[AgentError]] = {
    cls.code: cls
    for cls in (
        NotFound,
        PermissionDenied,
        IsADirectory,
        NotADirectory,
        AlreadyExists,
        InvalidPath,
        InvalidArgument,
        AgentTimeout,
        TooLarge,
        Unauthorized,
        Unsupported,
        AgentInternalError,
    )
}


def agent_error(code: str, message: str) -> AgentError:
    """The exception for an agent ``error`` message (protocol section 11)."""
    cls = _AGENT_ERRORS.get(code, AgentError)
    return cls(message, code=code)


# --- the connection and the process ------------------------------------------------------


class ConnectionLost(TetherError):
    """The WebSocket to the sandbox closed while an operation was in flight."""


class ProtocolError(TetherError):
    """The other side broke the Tether protocol (a malformed frame, a credit overrun)."""


class CommandFailed(TetherError):
    """A command run with ``check=True`` exited with a non-zero code."""

    def __init__(self, message: str, exit_code: int, stdout: str, stderr: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr


class CommandTimeout(TetherError):
    """A code-session execution did not finish within its timeout and was interrupted."""


class TemplateNotBuilt(TetherError):
    """A sandbox was asked of a template (``base``, ``data-science``) that is not built on this
    machine; the message names the command that builds it."""

    def __init__(self, name: str, layout: str) -> None:
        super().__init__(
            f"the template {name} is not built on this machine (no {layout}): build it with "
            f"`tether image build --template {name}` (as root; a few minutes, from the Debian "
            "archive and PyPI)"
        )
        self.name = name
        self.command = f"tether image build --template {name}"


class CodeSessionError(TetherError):
    """The stateful code session's driver process died or answered nonsense."""


def relay_error(status: int, code: str, message: str) -> RelayError:
    """The exception for a relay error response (``ErrorBody`` in client/src/api.rs). A 409
    is a :class:`Conflict`; the calls that know it means "paused" (``pause()``, opening a
    session) narrow it to :class:`SandboxPaused` with :func:`paused`."""
    cls: type[RelayError]
    if status == 400:
        cls = InvalidRequest
    elif status == 401:
        cls = AuthenticationError
    elif status == 403:
        cls = Forbidden
    elif status == 404:
        cls = SandboxNotFound
    elif status == 409:
        cls = Conflict
    elif status == 410:
        cls = SandboxGone
    elif status == 429:
        cls = RateLimited
    elif status == 501 and code == "unsupported":
        cls = ProviderUnsupported
    elif status >= 500:
        cls = RelayUnavailable
    else:
        cls = RelayError
    return cls(message, status=status, code=code)


def paused(exc: Conflict) -> SandboxPaused:
    """``exc``, a 409 from a call that only a paused sandbox refuses that way, as the
    :class:`SandboxPaused` it means."""
    return SandboxPaused(exc.message, status=exc.status, code=exc.code)
