"""Processes: run to completion, stream, background processes that outlive the connection
(re-attached by byte offset, so nothing is lost across a reconnect), signals and kills."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._constants import BULK_WINDOW, RETRY_ATTEMPTS, RETRY_BASE_S, RETRY_MAX_S
from ._protocol import Data, Message, Stream, expect_reply, raise_if_error
from .errors import (
    CommandFailed,
    ConnectionLost,
    ProtocolError,
    RelayUnavailable,
    RelayUnreachable,
    TetherError,
)
from .types import CommandResult, ExitStatus, OutputChunk, ProcessInfo

if TYPE_CHECKING:
    from ._sandbox import AsyncSandbox

OutputCallback = Callable[[bytes], "Awaitable[Any] | Any"]
"""Called with each piece of output as it arrives (a plain or an async function)."""

Command = str | Sequence[str]
"""A shell script (run by ``/bin/sh -c``) or an argv list (no shell)."""


def command_fields(
    cmd: Command,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    user: str | int | None = None,
    timeout: float | None = None,
) -> Message:
    """The ``exec`` fields every kind of process shares."""
    if isinstance(cmd, str):
        fields: Message = {"command": {"shell": cmd}}
    else:
        argv = [str(a) for a in cmd]
        if not argv:
            raise ValueError("the command's argv is empty; give at least the program")
        fields = {"command": {"argv": argv}}
    if env:
        fields["env"] = {str(k): str(v) for k, v in env.items()}
    if cwd is not None:
        fields["cwd"] = cwd
    if user is not None:
        fields["user"] = str(user)
    if timeout is not None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, not {timeout}")
        fields["timeout_ms"] = max(1, round(timeout * 1000))
    return fields


async def _call(callback: OutputCallback | None, data: bytes) -> None:
    if callback is not None:
        result = callback(data)
        if inspect.isawaitable(result):
            await result


async def _started(stream: Stream) -> Message:
    """Reads a process stream's ``started`` (or raises its error)."""
    item = await stream.recv()
    if item is None:
        raise ProtocolError("the process stream closed before it started")
    if isinstance(item, Data):
        raise ProtocolError("the process stream sent data before started")
    raise_if_error(item)
    if item.get("type") != "started":
        raise ProtocolError(f"expected started, got {item.get('type')!r}")
    return item


class AsyncCommandHandle:
    """A running process: iterate it for its output, :meth:`wait` for its result.

    A background process survives a dropped connection; its handle then re-attaches by itself
    from the byte offsets it reached, so the output it yields has no gap (a gap the agent
    could not fill, because the replay ring overwrote it, is recorded in :attr:`dropped`).
    """

    def __init__(
        self,
        sandbox: AsyncSandbox,
        stream: Stream,
        started: Message,
        *,
        background: bool,
        stdin: bool,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        collect: bool = True,
    ) -> None:
        self._sandbox = sandbox
        self._stream: Stream | None = stream
        self.process_id: int = _int(started, "process")
        self.pid: int = _int(started, "pid")
        offsets = started.get("offsets")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) for o in offsets)
        ):
            raise ProtocolError("started lacks its two offsets")
        self._pos = [int(offsets[0]), int(offsets[1])]
        self.background = background
        self._stdin = stdin
        self._on = {"out": on_stdout, "err": on_stderr}
        self._collect = collect
        self._buf = {"out": bytearray(), "err": bytearray()}
        self._order: list[tuple[str, int]] = []
        self._status: ExitStatus | None = None
        self.dropped: list[tuple[str, int, int]] = []
        """Gaps the agent reported: (``"stdout"``/``"stderr"``, from, to) byte offsets."""
        self._lock = asyncio.Lock()
        self.on_reattach: Callable[[], Awaitable[None]] | None = None
        """Called after the handle re-attached on a new connection (stdin written to the old
        one may have been lost on the way)."""

    @property
    def offsets(self) -> tuple[int, int]:
        """The next stdout and stderr byte offsets this handle would deliver."""
        return self._pos[0], self._pos[1]

    @property
    def exit_status(self) -> ExitStatus | None:
        """How the process ended, once the handle has seen it."""
        return self._status

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[OutputChunk]:
        while True:
            chunk = await self._next()
            if chunk is None:
                return
            yield chunk

    async def _next(self) -> OutputChunk | None:
        async with self._lock:
            while True:
                if self._stream is None:
                    return None
                try:
                    item = await self._stream.recv()
                except ConnectionLost:
                    if not self.background:
                        raise ConnectionLost(
                            "the connection broke and the foreground process was killed with it; "
                            "start it with background=True to survive reconnects"
                        ) from None
                    await self._reattach()
                    continue
                if item is None:
                    self._stream = None
                    return None
                if isinstance(item, Data):
                    index = 0 if item.channel == "out" else 1
                    offset = self._pos[index]
                    self._pos[index] += len(item.data)
                    if self._collect:
                        self._buf[item.channel] += item.data
                        self._order.append((item.channel, len(item.data)))
                    await _call(self._on[item.channel], item.data)
                    return OutputChunk("stdout" if index == 0 else "stderr", item.data, offset)
                kind = item.get("type")
                if kind == "exit":
                    self._status = ExitStatus.from_json(item.get("status"))
                elif kind == "dropped":
                    channel, start, end = item.get("channel"), item.get("from"), item.get("to")
                    if (
                        channel in ("out", "err")
                        and isinstance(end, int)
                        and isinstance(start, int)
                    ):
                        index = 0 if channel == "out" else 1
                        self._pos[index] = max(self._pos[index], end)
                        self.dropped.append(("stdout" if index == 0 else "stderr", start, end))
                elif kind == "error":
                    self._stream = None
                    raise_if_error(item)

    async def _reattach(self) -> None:
        """Re-attaches to the background process from the offsets reached, retrying while the
        sandbox is unreachable for a moment."""
        last: TetherError | None = None
        for attempt in range(RETRY_ATTEMPTS):
            try:
                stream = await self._sandbox._open(
                    "attach",
                    {
                        "process": self.process_id,
                        "out_offset": self._pos[0],
                        "err_offset": self._pos[1],
                        "stdin": self._stdin,
                    },
                    window=BULK_WINDOW,
                )
                started = await _started(stream)
                offsets = started.get("offsets")
                if isinstance(offsets, list) and len(offsets) == 2:
                    # Only ever forward: a `dropped` message explains any jump.
                    self._pos = [
                        max(self._pos[0], int(offsets[0])),
                        max(self._pos[1], int(offsets[1])),
                    ]
                self._stream = stream
                if self.on_reattach is not None:
                    await self.on_reattach()
                return
            except (ConnectionLost, RelayUnreachable, RelayUnavailable) as exc:
                # The relay may be restarting: its sandboxes and their processes live on.
                last = exc
                await asyncio.sleep(min(RETRY_BASE_S * 2**attempt, RETRY_MAX_S))
        raise ConnectionLost(f"could not re-attach to process {self.process_id}: {last}")

    async def wait(self, *, check: bool = False) -> CommandResult:
        """Reads the rest of the output and returns the result once the process ended.

        With ``check=True`` a non-zero exit raises :class:`CommandFailed`."""
        while await self._next() is not None:
            pass
        if self._status is None:
            # Detached without an exit (a cancel): ask the agent.
            self._status = await self._sandbox.commands.wait(self.process_id)
        result = self._result(self._status)
        if check and result.exit_code != 0:
            raise CommandFailed(
                f"command exited with {result.exit_code}: {result.stderr[-2000:]}",
                result.exit_code,
                result.stdout,
                result.stderr,
            )
        return result

    def _result(self, status: ExitStatus) -> CommandResult:
        combined = bytearray()
        pos = {"out": 0, "err": 0}
        for channel, n in self._order:
            combined += self._buf[channel][pos[channel] : pos[channel] + n]
            pos[channel] += n
        return CommandResult(
            stdout_bytes=bytes(self._buf["out"]),
            stderr_bytes=bytes(self._buf["err"]),
            output_bytes=bytes(combined),
            status=status,
            process_id=self.process_id,
            pid=self.pid,
        )

    async def send_stdin(self, data: bytes | str) -> None:
        """Writes to the process's stdin (started with ``stdin=True``)."""
        if self._stream is None:
            raise ConnectionLost("the process's stream has ended; its stdin is gone")
        await self._stream.send(data.encode() if isinstance(data, str) else data)

    async def close_stdin(self) -> None:
        """Closes the process's stdin: it reads end-of-file."""
        if self._stream is not None:
            await self._stream.eof()

    async def signal(self, signal: str | int, *, group: bool = False) -> None:
        """Sends a signal (``"TERM"``, ``"SIGINT"``, ``9``) to the process or its group."""
        await self._sandbox.commands.kill(self.process_id, signal=signal, group=group)

    async def kill(self) -> None:
        """Kills the process and everything it started (SIGKILL to its process group)."""
        await self._sandbox.commands.kill(self.process_id, signal="KILL", group=True)

    async def detach(self) -> None:
        """Stops receiving output; a background process runs on (re-attach later with
        :meth:`AsyncCommands.attach`), a foreground one is killed."""
        if self._stream is not None:
            await self._stream.cancel()
            while True:
                try:
                    if await self._stream.recv() is None:
                        break
                except ConnectionLost:
                    break
            self._stream = None


def _int(message: Message, name: str) -> int:
    value = message.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError(f"{message.get('type')} lacks a valid {name}")
    return value


class AsyncCommands:
    """``sandbox.commands``: run processes in the sandbox."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def run(
        self,
        cmd: Command,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | int | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
        merge_stderr: bool = False,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        check: bool = False,
    ) -> CommandResult:
        """Runs ``cmd`` to completion and returns its output and exit code.

        ``timeout`` (seconds) kills the process group and gives exit code 124 with
        ``timed_out``; ``output_limit`` (bytes, stdout and stderr together) cuts the output
        and sets ``truncated``; ``stdin`` is fed to the process, then closed.
        """
        handle = await self.start(
            cmd,
            env=env,
            cwd=cwd,
            user=user,
            stdin=stdin is not None,
            timeout=timeout,
            output_limit=output_limit,
            merge_stderr=merge_stderr,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
        )
        feeder: asyncio.Task[None] | None = None
        if stdin is not None:
            data = stdin.encode() if isinstance(stdin, str) else stdin

            async def feed() -> None:
                await handle.send_stdin(data)
                await handle.close_stdin()

            # Fed concurrently with reading, or a process that writes before it has read
            # everything would deadlock against us.
            feeder = asyncio.get_running_loop().create_task(feed())
        try:
            result = await handle.wait(check=check)
        finally:
            if feeder is not None:
                if not feeder.done():
                    feeder.cancel()
                try:
                    await feeder
                except (asyncio.CancelledError, TetherError):
                    pass
        return result

    async def start(
        self,
        cmd: Command,
        *,
        background: bool = False,
        tag: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | int | None = None,
        stdin: bool = False,
        timeout: float | None = None,
        output_limit: int | None = None,
        merge_stderr: bool = False,
        ring_bytes: int | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        collect: bool = True,
    ) -> AsyncCommandHandle:
        """Starts ``cmd`` and returns its handle once it runs.

        ``background=True`` lets it outlive this connection (find it again with :meth:`list`,
        :meth:`attach`); ``stdin=True`` keeps its stdin open for
        :meth:`AsyncCommandHandle.send_stdin`. ``collect=False`` keeps no output in memory
        (for long-running processes read by iteration or callbacks).
        """
        fields = command_fields(cmd, env=env, cwd=cwd, user=user, timeout=timeout)
        if stdin:
            fields["stdin"] = True
        if merge_stderr:
            fields["merge_stderr"] = True
        if output_limit is not None:
            if output_limit < 0:
                raise ValueError("output_limit must be 0 or more bytes")
            fields["output_limit"] = output_limit
        if background:
            fields["background"] = True
            if ring_bytes is not None:
                fields["ring_bytes"] = ring_bytes
        if tag is not None:
            fields["tag"] = tag
        stream = await self._sandbox._open("exec", fields, window=BULK_WINDOW)
        started = await _started(stream)
        return AsyncCommandHandle(
            self._sandbox,
            stream,
            started,
            background=background,
            stdin=stdin,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            collect=collect,
        )

    async def attach(
        self,
        process_id: int,
        *,
        out_offset: int = 0,
        err_offset: int = 0,
        stdin: bool = False,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        collect: bool = True,
    ) -> AsyncCommandHandle:
        """Attaches to a background process: its output from the given byte offsets (what the
        replay ring still holds), then live output."""
        stream = await self._sandbox._open(
            "attach",
            {
                "process": process_id,
                "out_offset": out_offset,
                "err_offset": err_offset,
                "stdin": stdin,
            },
            window=BULK_WINDOW,
        )
        started = await _started(stream)
        return AsyncCommandHandle(
            self._sandbox,
            stream,
            started,
            background=True,
            stdin=stdin,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            collect=collect,
        )

    async def list(self) -> list[ProcessInfo]:
        """The agent's running processes, and ended background ones not yet collected."""
        reply = await expect_reply(await self._sandbox._open("processes", {}), "processes")
        items = reply.get("processes")
        if not isinstance(items, list):
            raise ProtocolError("the processes reply lacks its list")
        return [ProcessInfo.from_json(p) for p in items]

    async def wait(self, process_id: int) -> ExitStatus:
        """Waits for a background process to end and returns how it did."""
        stream = await self._sandbox._open("wait", {"process": process_id})
        status: ExitStatus | None = None
        while (item := await stream.recv()) is not None:
            if isinstance(item, Data):
                raise ProtocolError("unexpected data on a wait stream")
            raise_if_error(item)
            if item.get("type") == "exit":
                status = ExitStatus.from_json(item.get("status"))
        if status is None:
            raise ProtocolError("the wait stream closed without an exit")
        return status

    async def kill(
        self, process_id: int, *, signal: str | int = "KILL", group: bool = True
    ) -> None:
        """Sends ``signal`` to a process (by default SIGKILL to its whole process group)."""
        await expect_reply(
            await self._sandbox._open(
                "kill", {"process": process_id, "signal": str(signal), "group": group}
            ),
            "ok",
        )
