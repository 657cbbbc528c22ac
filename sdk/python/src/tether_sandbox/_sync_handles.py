"""The blocking twins of the async handles: running processes and terminals, watches,
forwards and code sessions."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from ._code import AsyncCodeSession
from ._commands import AsyncCommandHandle
from ._files import AsyncWatch
from ._portal import _call, _iterate
from ._ports import AsyncForward
from ._pty import AsyncPtyHandle
from .types import (
    CodeResult,
    CommandResult,
    ExitStatus,
    FileEvent,
    OutputChunk,
)


class CommandHandle:
    """A running process (see :class:`AsyncCommandHandle`)."""

    def __init__(self, inner: AsyncCommandHandle) -> None:
        self._inner = inner

    @property
    def process_id(self) -> int:
        return self._inner.process_id

    @property
    def pid(self) -> int:
        return self._inner.pid

    @property
    def offsets(self) -> tuple[int, int]:
        return self._inner.offsets

    @property
    def dropped(self) -> list[tuple[str, int, int]]:
        return self._inner.dropped

    @property
    def exit_status(self) -> ExitStatus | None:
        return self._inner.exit_status

    def __iter__(self) -> Iterator[OutputChunk]:
        return _iterate(self._inner.__aiter__())

    def wait(self, *, check: bool = False) -> CommandResult:
        return _call(self._inner.wait(check=check))

    def send_stdin(self, data: bytes | str) -> None:
        _call(self._inner.send_stdin(data))

    def close_stdin(self) -> None:
        _call(self._inner.close_stdin())

    def signal(self, signal: str | int, *, group: bool = False) -> None:
        _call(self._inner.signal(signal, group=group))

    def kill(self) -> None:
        _call(self._inner.kill())

    def detach(self) -> None:
        _call(self._inner.detach())


class PtyHandle(CommandHandle):
    """A process on a terminal (see :class:`AsyncPtyHandle`)."""

    _inner: AsyncPtyHandle

    def __init__(self, inner: AsyncPtyHandle) -> None:
        super().__init__(inner)

    def write(self, data: bytes | str) -> None:
        _call(self._inner.write(data))

    def resize(self, cols: int, rows: int) -> None:
        _call(self._inner.resize(cols, rows))


class Watch:
    """Changes under a watched directory (see :class:`AsyncWatch`)."""

    def __init__(self, inner: AsyncWatch) -> None:
        self._inner = inner

    def __iter__(self) -> Iterator[FileEvent]:
        return _iterate(self._inner.__aiter__())

    def next(self, timeout: float | None = None) -> FileEvent | None:
        """The next change; raises ``TimeoutError`` after ``timeout`` seconds."""
        return _call(asyncio.wait_for(self._inner.next(), timeout))

    def close(self) -> None:
        _call(self._inner.close())


class Forward:
    """A host port forwarded into the sandbox (see :class:`AsyncForward`)."""

    def __init__(self, inner: AsyncForward) -> None:
        self._inner = inner

    @property
    def local_port(self) -> int:
        return self._inner.local_port

    @property
    def remote_port(self) -> int:
        return self._inner.remote_port

    @property
    def url(self) -> str:
        return self._inner.url

    def close(self) -> None:
        _call(self._inner.close())

    def __enter__(self) -> Forward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CodeSession:
    """A stateful Python session (see :class:`AsyncCodeSession`)."""

    def __init__(self, inner: AsyncCodeSession) -> None:
        self._inner = inner

    @property
    def process_id(self) -> int:
        return self._inner.process_id

    def run(self, code: str, *, timeout: float | None = None) -> CodeResult:
        return _call(self._inner.run(code, timeout=timeout))

    def close(self) -> None:
        _call(self._inner.close())

    def __enter__(self) -> CodeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
