"""The results the SDK returns, shared by :class:`~tether_sandbox.Sandbox` and
:class:`~tether_sandbox.AsyncSandbox`. Everything built from what the sandbox sent is
validated on the way in (:func:`_field`): a hostile agent gets an error, not a bad object."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import AgentError, ProtocolError

FileKind = Literal["file", "dir", "symlink", "other"]


def _field(obj: dict[str, Any], name: str, typ: type, default: Any = ...) -> Any:
    value = obj.get(name)
    if value is None:
        if default is ...:
            raise ProtocolError(f"the sandbox's reply lacks {name!r}")
        return default
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ProtocolError(f"the sandbox's reply has a non-integer {name!r}")
    if typ is not int and not isinstance(value, typ):
        raise ProtocolError(f"the sandbox's reply has a mistyped {name!r}")
    return value


NetworkMode = Literal["none", "host", "allowlist"]

IdleAction = Literal["delete", "pause", "stop"]
"""What a sandbox's idle timeout does: delete it (the default), or pause it."""


@dataclass(frozen=True)
class Secret:
    """A secret the sandbox uses without holding it: its environment variable ``name`` gets a
    placeholder, which the relay's egress proxy replaces with the value in requests to
    ``hosts`` only. ``value`` (absent: the relay's secret store) is sent once, at create; it
    never appears in ``repr`` or in anything the relay returns."""

    name: str
    hosts: Sequence[str]
    value: str | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"name": self.name, "hosts": list(self.hosts)}
        if self.value is not None:
            body["value"] = self.value
        return body


@dataclass(frozen=True)
class SecretBinding:
    """A secret bound to a sandbox, as the relay reports it: never its value."""

    name: str
    hosts: list[str]


def _strings(items: Any) -> list[str]:
    return [str(x) for x in (items or [])]


@dataclass(frozen=True)
class NetworkInfo:
    """A sandbox's network access as created, and what its provider guarantees for it."""

    mode: str
    allow_hosts: list[str]
    allow_cidrs: list[str]
    secrets: list[SecretBinding]
    enforced_by: str
    """``relay`` (the relay's own egress proxy and rules), or the provider's name."""
    guarantees: list[str]
    not_guaranteed: list[str]

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> NetworkInfo:
        egress = obj.get("egress") or {}
        return cls(
            mode=str(obj.get("mode", "")),
            allow_hosts=_strings(egress.get("allow_hosts")),
            allow_cidrs=_strings(egress.get("allow_cidrs")),
            secrets=[
                SecretBinding(name=str(s.get("name", "")), hosts=_strings(s.get("hosts")))
                for s in obj.get("secrets") or []
            ],
            enforced_by=str(obj.get("enforced_by", "")),
            guarantees=_strings(obj.get("guarantees")),
            not_guaranteed=_strings(obj.get("not_guaranteed")),
        )


@dataclass(frozen=True)
class SandboxCapabilities:
    """What a sandbox's provider can do with it beyond create, connect and delete (all False
    from relays that do not report it)."""

    pause: bool = False
    """Pause (processes frozen, memory kept) and resume."""
    stop: bool = False
    """Stop (processes ended, files kept) and start."""


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the relay knows it."""

    id: str
    provider: str
    state: str
    """``running``, ``paused`` (``resume()``, or with auto-resume any call, continues it),
    ``stopped`` (``start()``, or with auto-resume any call, boots it again), ``dead`` (its
    agent exited; delete it), ``gone`` or ``unknown``."""
    labels: dict[str, str]
    image: str | None
    created_ms: int
    last_active_ms: int
    expires_ms: int | None
    idle_timeout_secs: int | None
    created: bool
    """False when get-or-create found an existing sandbox."""
    network: NetworkInfo | None = None
    """Its network access and guarantees (None from relays that do not report them)."""
    capabilities: SandboxCapabilities = field(default_factory=SandboxCapabilities)
    """What its provider can do with it beyond create, connect and delete."""
    auto_resume: bool = True
    """Whether a new session (or a preview request) resumes it while it is paused; when
    False, only ``resume()`` does, and reaching it paused raises :class:`SandboxPaused`."""
    on_idle: IdleAction = "delete"
    """What its idle timeout does: ``delete``, ``pause`` or ``stop``."""

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> SandboxInfo:
        network = obj.get("network")
        capabilities = obj.get("capabilities")
        return cls(
            id=str(obj["id"]),
            provider=str(obj.get("provider", "")),
            state=str(obj.get("state", "")),
            labels={str(k): str(v) for k, v in (obj.get("labels") or {}).items()},
            image=obj.get("image"),
            created_ms=int(obj.get("created_ms") or 0),
            last_active_ms=int(obj.get("last_active_ms") or 0),
            expires_ms=obj.get("expires_ms"),
            idle_timeout_secs=obj.get("idle_timeout_secs"),
            created=bool(obj.get("created", False)),
            network=NetworkInfo.from_json(network) if isinstance(network, dict) else None,
            capabilities=SandboxCapabilities(
                pause=isinstance(capabilities, dict) and capabilities.get("pause") is True,
                stop=isinstance(capabilities, dict) and capabilities.get("stop") is True,
            ),
            auto_resume=obj.get("auto_resume") is not False,
            on_idle=_idle_action(obj.get("on_idle")),
        )


def _idle_action(value: object) -> IdleAction:
    """The idle action a relay answered; ``delete`` for one this SDK does not know."""
    if value == "pause":
        return "pause"
    if value == "stop":
        return "stop"
    return "delete"


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended (protocol ``exit`` status)."""

    code: int | None
    signal: int | None
    timed_out: bool
    truncated: bool

    @property
    def exit_code(self) -> int:
        """One shell exit code: 124 on timeout (as ``timeout(1)``), else the code, else
        128 + the signal."""
        if self.timed_out:
            return 124
        if self.code is not None:
            return self.code
        return 128 + (self.signal or 0)

    @classmethod
    def from_json(cls, obj: Any) -> ExitStatus:
        if not isinstance(obj, dict):
            raise ProtocolError("the sandbox sent an exit without a status object")
        return cls(
            code=_field(obj, "code", int, None),
            signal=_field(obj, "signal", int, None),
            timed_out=bool(obj.get("timed_out", False)),
            truncated=bool(obj.get("truncated", False)),
        )


@dataclass(frozen=True)
class CommandResult:
    """A finished command: its output, and how it ended."""

    stdout_bytes: bytes
    stderr_bytes: bytes
    output_bytes: bytes
    """stdout and stderr interleaved in the order they arrived."""
    status: ExitStatus
    process_id: int
    pid: int

    @property
    def exit_code(self) -> int:
        """124 on timeout, else the exit code, else 128 + signal."""
        return self.status.exit_code

    @property
    def timed_out(self) -> bool:
        """The command ran past its timeout and was killed."""
        return self.status.timed_out

    @property
    def truncated(self) -> bool:
        """Output was cut at the command's output limit."""
        return self.status.truncated

    @property
    def stdout(self) -> str:
        """stdout as text (invalid UTF-8 replaced)."""
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """stderr as text (invalid UTF-8 replaced)."""
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def output(self) -> str:
        """stdout and stderr interleaved, as text."""
        return self.output_bytes.decode("utf-8", "replace")


@dataclass(frozen=True)
class OutputChunk:
    """A piece of a running command's output."""

    stream: Literal["stdout", "stderr"]
    data: bytes
    offset: int
    """The byte offset of ``data`` in its channel (for re-attaching)."""


@dataclass(frozen=True)
class ProcessInfo:
    """A process the agent started (``processes`` reply)."""

    process_id: int
    pid: int
    tag: str | None
    command: str
    pty: bool
    exit: ExitStatus | None
    out_offset: int
    err_offset: int
    started_ms: int

    @property
    def running(self) -> bool:
        return self.exit is None

    @classmethod
    def from_json(cls, obj: Any) -> ProcessInfo:
        if not isinstance(obj, dict):
            raise ProtocolError("the sandbox sent a process that is not an object")
        offsets = obj.get("offsets")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and o >= 0 for o in offsets)
        ):
            raise ProtocolError("the sandbox sent a process without two offsets")
        exit_obj = obj.get("exit")
        return cls(
            process_id=_field(obj, "process", int),
            pid=_field(obj, "pid", int),
            tag=_field(obj, "tag", str, None),
            command=_field(obj, "command", str, ""),
            pty=bool(obj.get("pty", False)),
            exit=ExitStatus.from_json(exit_obj) if exit_obj is not None else None,
            out_offset=offsets[0],
            err_offset=offsets[1],
            started_ms=_field(obj, "started_ms", int, 0),
        )


@dataclass(frozen=True)
class FileInfo:
    """A path's metadata (``stat``, and each entry of a listing)."""

    path: str
    name: str
    kind: FileKind
    size: int
    mode: int
    mtime_ms: int
    target: str | None = None

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @property
    def is_file(self) -> bool:
        return self.kind == "file"

    @classmethod
    def from_json(cls, obj: Any) -> FileInfo:
        if not isinstance(obj, dict):
            raise ProtocolError("the sandbox sent a file entry that is not an object")
        kind = _field(obj, "kind", str)
        if kind not in ("file", "dir", "symlink", "other"):
            raise ProtocolError(f"the sandbox sent an unknown file kind {kind!r:.40}")
        size = _field(obj, "size", int)
        if size < 0:
            raise ProtocolError("the sandbox sent a negative file size")
        path = _field(obj, "path", str)
        return cls(
            path=path,
            name=path.rstrip("/").rsplit("/", 1)[-1],
            kind=kind,
            size=size,
            mode=_field(obj, "mode", int, 0),
            mtime_ms=_field(obj, "mtime_ms", int, 0),
            target=_field(obj, "target", str, None),
        )


@dataclass(frozen=True)
class GlobResult:
    """Paths matching a glob, relative to its root."""

    paths: list[str]
    truncated: bool


@dataclass(frozen=True)
class GrepMatch:
    """One matching line."""

    path: str
    line: int
    text: str


@dataclass(frozen=True)
class GrepResult:
    """The lines a grep found."""

    matches: list[GrepMatch]
    truncated: bool


@dataclass(frozen=True)
class WriteResult:
    """The outcome of one file of a batch upload: ``size`` written, or ``error``."""

    path: str
    size: int | None
    error: AgentError | None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class ReadResult:
    """The outcome of one file of a batch download: its ``data``, or ``error``."""

    path: str
    data: bytes | None
    error: AgentError | None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class FileEvent:
    """A change seen by a watch. ``kind`` is create, modify, remove, rename or overflow;
    ``path`` is relative to the watched directory (for rename: the new path, with
    ``old_path`` the old one)."""

    kind: Literal["create", "modify", "remove", "rename", "overflow"]
    path: str | None
    old_path: str | None = None
    is_dir: bool = False


@dataclass(frozen=True)
class ListeningPort:
    """A TCP port listening inside the sandbox."""

    port: int
    address: str


@dataclass(frozen=True)
class AgentInfo:
    """Facts about the sandbox's agent and machine."""

    agent_version: str
    os: str
    arch: str
    user: str
    home: str
    cwd: str
    hostname: str
    cpus: int
    memory_bytes: int


@dataclass(frozen=True)
class CodeError:
    """A Python exception raised by code in a code session."""

    name: str
    value: str
    traceback: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.name}: {self.value}"


@dataclass(frozen=True)
class CodeResult:
    """One execution in a stateful code session."""

    stdout: str
    stderr: str
    value: str | None
    """``repr`` of the last expression's value, when the code ended with an expression."""
    error: CodeError | None
    images: list[bytes]
    """PNG bytes of every matplotlib figure the code left open (then closed)."""
    charts: list[dict[str, Any]] = field(default_factory=list)
    """The data behind those figures, one per image, shaped as E2B's chart objects:
    ``{"type": "line"|"scatter"|"bar"|"superchart"|"unknown", "title", "x_label", "y_label",
    "elements"}`` (lines and scatters: ``{"label", "points": [[x, y], ...]}``; bars:
    ``{"label", "group", "value"}``; a superchart's elements are charts)."""

    @property
    def ok(self) -> bool:
        return self.error is None
