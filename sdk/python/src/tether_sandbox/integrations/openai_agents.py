"""The OpenAI Agents SDK on Tether: a sandbox client and session for ``agents.sandbox``.

``TetherSandboxClient`` creates, resumes and deletes Tether sandboxes for the SDK's sandbox
agents; ``TetherSandboxSession`` runs their commands (``exec``), reads and writes files with
the agent's native operations, persists the workspace as a tar archive and hydrates it back
(checked for unsafe members first), runs PTY sessions, and resolves exposed ports to preview
URLs through the relay (or, where the preview URL needs a path, which the SDK's endpoint type
cannot carry, to a local forward on 127.0.0.1, as the SDK's own Docker sandboxes publish). The session's state (``TetherSandboxSessionState``) serializes
without the token, so a run can be resumed in another process.

``pause_on_exit=True`` (as on the SDK's E2B, Daytona, Blaxel and Runloop clients) pauses the
sandbox when the session shuts down instead of deleting it, and ``client.delete(session)``
leaves it: ``resume(state)`` then finds it paused, with its processes and memory, and the
session's first call resumes it.

Install with ``pip install 'tether-sandbox[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import io
import logging
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    ExposedPortUnavailableError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceWriteTypeError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session import SandboxSession, SandboxSessionState
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PTY_PROCESSES_MAX,
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tar_bytes
from pydantic import Field

from .. import errors
from .._commands import AsyncCommandHandle
from .._ports import AsyncForward
from .._pty import AsyncPtyHandle
from .._sandbox import AsyncSandbox
from .._sync import Sandbox
from ..types import SandboxInfo
from ._bridge import run_async

_log = logging.getLogger(__name__)

DEFAULT_TTL_S = 3600  # a new sandbox's lifetime unless the options say otherwise
MAX_WORKSPACE_BYTES = 4 << 30  # 4 GiB: the largest workspace archive persisted


class TetherSandboxClientOptions(BaseSandboxClientOptions):
    """How ``TetherSandboxClient.create`` makes a sandbox."""

    type: Literal["tether"] = "tether"
    image: str | None = None
    labels: dict[str, str] | None = None
    ttl: float | None = DEFAULT_TTL_S
    idle_timeout: float | None = None
    envs: dict[str, str] | None = None
    memory_bytes: int | None = None
    network: Literal["none", "host"] | None = None
    exposed_ports: tuple[int, ...] = ()
    delete_on_shutdown: bool = True
    pause_on_exit: bool = False


class TetherSandboxSessionState(SandboxSessionState):
    """What resuming needs: the sandbox's id and how to recreate it (never the token)."""

    type: Literal["tether"] = "tether"
    sandbox_id: str
    image: str | None = None
    labels: dict[str, str] | None = None
    ttl: float | None = DEFAULT_TTL_S
    idle_timeout: float | None = None
    memory_bytes: int | None = None
    network: Literal["none", "host"] | None = None
    base_envs: dict[str, str] = Field(default_factory=dict)
    delete_on_shutdown: bool = True
    pause_on_exit: bool = False


@dataclass
class _PtyEntry:
    """One PTY (or piped) process and the output it produced since the last collection.
    Output arrives on the SDK's loop and is handed to the session's loop thread-safely."""

    handle: AsyncCommandHandle | None = None  # an AsyncPtyHandle when tty
    tty: bool = False
    output_chunks: deque[bytes] = field(default_factory=deque)
    output_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    output_notify: asyncio.Event = field(default_factory=asyncio.Event)
    output_closed: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None
    wait_task: asyncio.Task[None] | None = None


class TetherSandboxSession(BaseSandboxSession):
    """A sandbox session on one Tether sandbox."""

    state: TetherSandboxSessionState

    def __init__(self, *, state: TetherSandboxSessionState, sandbox: Sandbox) -> None:
        self.state = state
        self._sandbox = sandbox
        self._pty: dict[int, _PtyEntry] = {}
        self._pty_ids: set[int] = set()
        self._forwards: dict[int, AsyncForward] = {}

    @property
    def sandbox(self) -> Sandbox:
        return self._sandbox

    @property
    def _sb(self) -> AsyncSandbox:
        return self._sandbox.async_sandbox

    async def _envs(self) -> dict[str, str]:
        manifest_envs = await self.state.manifest.environment.resolve()
        return {**self.state.base_envs, **manifest_envs}

    async def _ensure_backend_started(self) -> None:
        await run_async(self._sb.files.mkdir(self.state.manifest.root))

    # --- commands -----------------------------------------------------------------------------

    async def _exec_internal(
        self, *command: str | Path, timeout: float | None = None
    ) -> ExecResult:
        argv = [str(c) for c in command]
        user: str | None = None
        if len(argv) >= 4 and argv[0] == "sudo" and argv[1] == "-u" and argv[3] == "--":
            # SandboxSession.exec's `sudo -u USER --` prefix: the agent runs as USER itself.
            user, argv = argv[2], argv[4:]
        cwd = self.state.manifest.root if self.state.workspace_root_ready else None
        try:
            result = await run_async(
                self._sb.commands.run(
                    argv, timeout=timeout, cwd=cwd, user=user, env=await self._envs()
                )
            )
        except errors.TetherError as exc:
            raise ExecTransportError(command=argv, cause=exc, message=str(exc)) from exc
        if result.timed_out:
            raise ExecTimeoutError(command=argv, timeout_s=timeout)
        return ExecResult(
            stdout=result.stdout_bytes, stderr=result.stderr_bytes, exit_code=result.exit_code
        )

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        name = user.name if isinstance(user, User) else user
        entry = _PtyEntry(tty=tty)
        loop = asyncio.get_running_loop()

        def on_data(data: bytes) -> None:  # runs on the SDK's loop
            loop.call_soon_threadsafe(_push, entry, data)

        cwd = self.state.manifest.root if self.state.workspace_root_ready else None
        env = await self._envs()
        inner: AsyncCommandHandle
        try:
            if tty:
                inner = await run_async(
                    self._sb.pty.start(argv, cwd=cwd, env=env, on_data=on_data, timeout=timeout)
                )
            else:
                inner = await run_async(
                    self._sb.commands.start(
                        argv,
                        cwd=cwd,
                        env=env,
                        user=name,
                        timeout=timeout,
                        merge_stderr=True,
                        on_stdout=on_data,
                        collect=False,
                    )
                )
        except errors.TetherError as exc:
            raise ExecTransportError(command=argv, cause=exc, message=str(exc)) from exc
        entry.handle = inner
        entry.wait_task = asyncio.create_task(self._wait(entry))
        if len(self._pty) >= PTY_PROCESSES_MAX:
            oldest = min(self._pty)
            await self._terminate(self._pty.pop(oldest))
            self._pty_ids.discard(oldest)
        process_id = allocate_pty_process_id(self._pty_ids)
        self._pty_ids.add(process_id)
        self._pty[process_id] = entry
        wait_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._collect(
            process_id, entry, clamp_pty_yield_time_ms(wait_ms), max_output_tokens
        )

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        entry = self._resolve_pty_session_entry(pty_processes=self._pty, session_id=session_id)
        if chars:
            if not isinstance(entry.handle, AsyncPtyHandle):
                raise RuntimeError("stdin is not available for this process (start it with tty)")
            await run_async(entry.handle.write(chars.encode()))
        wait_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        wait_ms = resolve_pty_write_yield_time_ms(yield_time_ms=wait_ms, input_empty=chars == "")
        return await self._collect(session_id, entry, wait_ms, max_output_tokens)

    async def pty_terminate_all(self) -> None:
        entries = list(self._pty.values())
        self._pty.clear()
        self._pty_ids.clear()
        for entry in entries:
            await self._terminate(entry)

    async def _wait(self, entry: _PtyEntry) -> None:
        assert entry.handle is not None
        try:
            result = await run_async(entry.handle.wait())
            entry.exit_code = result.exit_code
        except errors.TetherError:
            entry.exit_code = -1
        entry.output_closed.set()
        entry.output_notify.set()

    async def _collect(
        self, process_id: int, entry: _PtyEntry, wait_ms: int, max_tokens: int | None
    ) -> PtyExecUpdate:
        output, tokens, closed = await collect_pty_output(
            output_chunks=entry.output_chunks,
            output_lock=entry.output_lock,
            output_notify=entry.output_notify,
            is_done=entry.output_closed.is_set,
            yield_time_ms=wait_ms,
            max_output_tokens=max_tokens,
        )
        exit_code = entry.exit_code if closed else None
        live: int | None = process_id
        if exit_code is not None:
            self._pty.pop(process_id, None)
            self._pty_ids.discard(process_id)
            live = None
        return PtyExecUpdate(
            process_id=live, output=output, exit_code=exit_code, original_token_count=tokens
        )

    async def _terminate(self, entry: _PtyEntry) -> None:
        if entry.exit_code is None and entry.handle is not None:
            try:
                await run_async(entry.handle.kill())
            except errors.TetherError:
                pass
        if entry.wait_task is not None:
            await asyncio.gather(entry.wait_task, return_exceptions=True)

    # --- files ---------------------------------------------------------------------------------

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        if user is not None:
            await self._check_read_with_exec(path, user=user)
        target = await self._validate_path_access(path)
        try:
            data = await run_async(self._sb.files.read(target.as_posix()))
        except errors.NotFound as exc:
            raise WorkspaceReadNotFoundError(path=path, cause=exc) from exc
        except errors.TetherError as exc:
            raise WorkspaceArchiveReadError(path=path, cause=exc) from exc
        return io.BytesIO(data)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        if user is not None:
            await self._check_write_with_exec(path, user=user)
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, bytes | bytearray):
            raise WorkspaceWriteTypeError(path=path, actual_type=type(payload).__name__)
        target = await self._validate_path_access(path, for_write=True)
        try:
            await run_async(self._sb.files.write(target.as_posix(), bytes(payload)))
        except errors.TetherError as exc:
            raise WorkspaceArchiveWriteError(path=target, cause=exc) from exc

    async def running(self) -> bool:
        try:
            info = await run_async(self._sb.refresh())
        except errors.TetherError:
            return False
        # A paused sandbox is as good as running: the session's next call resumes it, with
        # its processes and workspace where they were.
        return _reachable(info)

    # --- the workspace as tar ------------------------------------------------------------------

    async def persist_workspace(self) -> io.IOBase:
        root = self._workspace_root_path()
        exclude = [p.as_posix() for p in sorted(self._persist_workspace_skip_relpaths())]
        try:
            archive = await run_async(
                self._sb.files.read_tar(
                    root.as_posix(), exclude=exclude, max_bytes=MAX_WORKSPACE_BYTES
                )
            )
        except errors.TetherError as exc:
            raise WorkspaceArchiveReadError(path=root, cause=exc) from exc
        return io.BytesIO(archive)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = self._workspace_root_path()
        raw = data.read()
        if isinstance(raw, str):
            raw = raw.encode("utf-8")
        if not isinstance(raw, bytes | bytearray):
            raise WorkspaceWriteTypeError(path=root, actual_type=type(raw).__name__)
        try:
            validate_tar_bytes(bytes(raw), allow_external_symlink_targets=False)
        except UnsafeTarMemberError as exc:
            raise WorkspaceArchiveWriteError(
                path=root,
                context={"reason": "unsafe_or_invalid_tar", "member": exc.member},
                cause=exc,
            ) from exc
        try:
            await run_async(self._sb.files.mkdir(root.as_posix()))
            await run_async(self._sb.files.write_tar(root.as_posix(), bytes(raw)))
        except errors.TetherError as exc:
            raise WorkspaceArchiveWriteError(path=root, cause=exc) from exc

    # --- ports and lifecycle -------------------------------------------------------------------

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        try:
            url = await run_async(self._sb.ports.preview_url(port))
            parts = urlsplit(url)
            if parts.path not in ("", "/"):
                # The path form (this machine cannot resolve the host form's *.localhost name):
                # an endpoint is host, port and query, with no path, so carry the port by a
                # forward on loopback instead, reused for the session's life.
                if port not in self._forwards:
                    self._forwards[port] = await run_async(self._sb.ports.forward(port))
                return ExposedPortEndpoint(host="127.0.0.1", port=self._forwards[port].local_port)
        except (errors.TetherError, ValueError, OSError) as exc:
            raise ExposedPortUnavailableError(
                port=port,
                exposed_ports=self.state.exposed_ports,
                reason="backend_unavailable",
                context={"backend": "tether"},
                cause=exc,
            ) from exc
        tls = parts.scheme == "https"
        return ExposedPortEndpoint(
            host=parts.hostname or "",
            port=parts.port or (443 if tls else 80),
            tls=tls,
            query=parts.query,
        )

    async def _shutdown_backend(self) -> None:
        await self.pty_terminate_all()
        forwards, self._forwards = list(self._forwards.values()), {}
        for forward in forwards:
            await run_async(forward.close())
        if self.state.pause_on_exit:
            try:
                await run_async(self._sb.pause())
                return
            except (errors.SandboxPaused, errors.SandboxNotFound, errors.SandboxGone):
                return
            except errors.TetherError as exc:
                # A provider that cannot pause, or a failed pause: what the session would do
                # without pause_on_exit (the SDK's E2B client falls back to a kill too).
                _log.warning(
                    "cannot pause sandbox %s on shutdown (%s); %s",
                    self.state.sandbox_id,
                    exc,
                    "deleting it" if self.state.delete_on_shutdown else "leaving it running",
                )
        if self.state.delete_on_shutdown:
            try:
                await run_async(self._sb.delete())
            except (errors.SandboxNotFound, errors.SandboxGone):
                pass


def _reachable(info: SandboxInfo) -> bool:
    """Whether a session's calls can reach the sandbox: it runs, or it is paused and the
    first call resumes it."""
    return info.state == "running" or (info.state == "paused" and info.auto_resume)


def _push(entry: _PtyEntry, data: bytes) -> None:
    entry.output_chunks.append(data)
    entry.output_notify.set()


class TetherSandboxClient(BaseSandboxClient[TetherSandboxClientOptions]):
    """Makes Tether sandboxes for the Agents SDK. ``relay``/``token`` default to
    ``TETHER_RELAY``/``TETHER_TOKEN``."""

    backend_id = "tether"

    def __init__(
        self,
        *,
        relay: str | None = None,
        token: str | None = None,
        instrumentation: Instrumentation | None = None,
    ) -> None:
        self._auth: dict[str, Any] = {"relay": relay, "token": token}
        self._instrumentation = instrumentation or Instrumentation()
        self._dependencies = None

    async def _new_sandbox(self, state: TetherSandboxSessionState, envs: dict[str, str]) -> Sandbox:
        inner = await run_async(
            AsyncSandbox.create(
                image=state.image,
                labels=state.labels,
                ttl=state.ttl,
                idle_timeout=state.idle_timeout,
                env=envs or None,
                memory_bytes=state.memory_bytes,
                network=state.network,
                **self._auth,
            )
        )
        return Sandbox(inner)

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: TetherSandboxClientOptions | None = None,
    ) -> SandboxSession:
        options = options or TetherSandboxClientOptions()
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        session_id = uuid.uuid4()
        state = TetherSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            sandbox_id="",
            image=options.image,
            labels=options.labels,
            ttl=options.ttl,
            idle_timeout=options.idle_timeout,
            memory_bytes=options.memory_bytes,
            network=options.network,
            base_envs=dict(options.envs or {}),
            delete_on_shutdown=options.delete_on_shutdown,
            pause_on_exit=options.pause_on_exit,
            exposed_ports=options.exposed_ports,
        )
        envs = {**state.base_envs, **await manifest.environment.resolve()}
        sandbox = await self._new_sandbox(state, envs)
        state.sandbox_id = sandbox.id
        inner = TetherSandboxSession(state=state, sandbox=sandbox)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Deletes the session's sandbox; a sandbox already gone is deleted.

        The Agents SDK calls this after the session has shut down (its runtime: ``shutdown()``
        then ``client.delete(session)``; its docs: ``client.delete(session)`` after ``async
        with session``), when the session's own relay client may be closed (shutting down
        with ``delete_on_shutdown`` deletes the sandbox and closes it). So the sandbox is
        found again by id through this client's relay, never through the session's client.
        """
        inner = session._inner
        if not isinstance(inner, TetherSandboxSession):
            raise TypeError("TetherSandboxClient.delete expects a TetherSandboxSession")
        if inner.state.pause_on_exit:
            # Shutting down paused it to be resumed later, as the SDK's E2B client keeps a
            # paused sandbox through delete().
            return session
        await run_async(self._delete_by_id(inner.state.sandbox_id))
        return session

    async def _delete_by_id(self, sandbox_id: str) -> None:
        try:
            sandbox = await AsyncSandbox.connect(sandbox_id, **self._auth)
        except (errors.SandboxNotFound, errors.SandboxGone):
            return
        try:
            await sandbox.delete()
        except (errors.SandboxNotFound, errors.SandboxGone):
            pass

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, TetherSandboxSessionState):
            raise TypeError("TetherSandboxClient.resume expects a TetherSandboxSessionState")
        state.assert_path_grants_rebound()
        reconnected = False
        try:
            sandbox = Sandbox(await run_async(AsyncSandbox.connect(state.sandbox_id, **self._auth)))
            info = sandbox.info
            if info.state == "paused" and not info.auto_resume:
                # Resuming the run is the explicit resume such a sandbox waits for.
                info = await run_async(sandbox.async_sandbox.resume())
            reconnected = _reachable(info)
        except (errors.SandboxNotFound, errors.SandboxGone):
            pass
        if not reconnected:
            envs = {**state.base_envs, **await state.manifest.environment.resolve()}
            sandbox = await self._new_sandbox(state, envs)
            state.sandbox_id = sandbox.id
            state.workspace_root_ready = False
        inner = TetherSandboxSession(state=state, sandbox=sandbox)
        inner._set_start_state_preserved(reconnected, system=reconnected)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, TetherSandboxSessionState)


__all__ = [
    "TetherSandboxClient",
    "TetherSandboxClientOptions",
    "TetherSandboxSession",
    "TetherSandboxSessionState",
]
