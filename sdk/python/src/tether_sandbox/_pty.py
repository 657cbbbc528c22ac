"""Terminals: a process under a pseudo-terminal, typed into and resized like an SSH session."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ._commands import AsyncCommandHandle, Command, OutputCallback, _started, command_fields
from ._constants import INITIAL_WINDOW
from .errors import ConnectionLost

if TYPE_CHECKING:
    from ._sandbox import AsyncSandbox

DEFAULT_SHELL = "command -v bash >/dev/null 2>&1 && exec bash -l || exec sh -l"
"""What a terminal runs when no command is given: bash if the image has it, else sh."""


class AsyncPtyHandle(AsyncCommandHandle):
    """A process on a terminal: :meth:`write` keystrokes, iterate (or ``on_data``) for what
    the terminal shows, :meth:`resize`, :meth:`wait`. Output is all on ``stdout``."""

    async def write(self, data: bytes | str) -> None:
        """Types ``data`` (``"\\x03"`` is Ctrl-C, ``"\\x04"`` Ctrl-D)."""
        await self.send_stdin(data)

    async def resize(self, cols: int, rows: int) -> None:
        """Changes the terminal's size; the process gets SIGWINCH."""
        if self._stream is None:
            raise ConnectionLost("the terminal's stream has ended")
        await self._stream.resize(cols, rows)


class AsyncPty:
    """``sandbox.pty``: terminals."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def start(
        self,
        cmd: Command | None = None,
        *,
        cols: int = 80,
        rows: int = 24,
        term: str = "xterm-256color",
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | int | None = None,
        timeout: float | None = None,
        background: bool = False,
        tag: str | None = None,
        on_data: OutputCallback | None = None,
    ) -> AsyncPtyHandle:
        """Starts ``cmd`` (by default a login shell) on a ``cols`` x ``rows`` terminal."""
        fields = command_fields(cmd or DEFAULT_SHELL, env=env, cwd=cwd, user=user, timeout=timeout)
        fields["stdin"] = True
        fields["pty"] = {"cols": cols, "rows": rows, "term": term}
        if background:
            fields["background"] = True
        if tag is not None:
            fields["tag"] = tag
        stream = await self._sandbox._open("exec", fields, window=INITIAL_WINDOW)
        started = await _started(stream)
        return AsyncPtyHandle(
            self._sandbox, stream, started, background=background, stdin=True, on_stdout=on_data
        )
