"""The blocking API: ``Sandbox`` and its parts, each a thin shell around its async twin.

Every call is handed to one private event loop running on a daemon thread (the portal) and
waited for, so the sync and async APIs share all their logic and result types. Callbacks
(``on_stdout``...) run on that loop's thread.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import threading
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Literal, TypeVar

from ._code import AsyncCodeSession
from ._commands import AsyncCommandHandle, AsyncCommands, Command, OutputCallback
from ._constants import DEFAULT_MAX_DOWNLOAD, DEFAULT_MAX_READ
from ._files import AsyncFiles, AsyncWatch, IfExists
from ._ports import AsyncForward, AsyncPorts
from ._pty import AsyncPty, AsyncPtyHandle
from ._sandbox import AsyncSandbox, Language
from .types import (
    AgentInfo,
    CodeResult,
    CommandResult,
    ExitStatus,
    FileEvent,
    FileInfo,
    GlobResult,
    GrepResult,
    ListeningPort,
    OutputChunk,
    ProcessInfo,
    ReadResult,
    SandboxInfo,
    WriteResult,
)

T = TypeVar("T")


class _Portal:
    """An event loop on a daemon thread, shared by every sync object of the process."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def loop(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="tether-sandbox-loop", daemon=True
                )
                thread.start()
                cls._loop = loop
            return cls._loop


def _call(coro: Coroutine[Any, Any, T]) -> T:
    loop = _Portal.loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError(
            "a blocking Sandbox call from inside its own callback would deadlock; "
            "use AsyncSandbox in async code"
        )
    future: Future[T] = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


def _iterate(aiter: AsyncIterator[T]) -> Iterator[T]:
    async def step() -> tuple[bool, T | None]:
        try:
            return True, await aiter.__anext__()
        except StopAsyncIteration:
            return False, None

    while True:
        more, item = _call(step())
        if not more:
            return
        yield item  # type: ignore[misc]


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


class Commands:
    """``sandbox.commands`` (see :class:`AsyncCommands`)."""

    def __init__(self, inner: AsyncCommands) -> None:
        self._inner = inner

    def run(
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
        return _call(
            self._inner.run(
                cmd,
                env=env,
                cwd=cwd,
                user=user,
                stdin=stdin,
                timeout=timeout,
                output_limit=output_limit,
                merge_stderr=merge_stderr,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
                check=check,
            )
        )

    def start(
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
    ) -> CommandHandle:
        return CommandHandle(
            _call(
                self._inner.start(
                    cmd,
                    background=background,
                    tag=tag,
                    env=env,
                    cwd=cwd,
                    user=user,
                    stdin=stdin,
                    timeout=timeout,
                    output_limit=output_limit,
                    merge_stderr=merge_stderr,
                    ring_bytes=ring_bytes,
                    on_stdout=on_stdout,
                    on_stderr=on_stderr,
                    collect=collect,
                )
            )
        )

    def attach(
        self,
        process_id: int,
        *,
        out_offset: int = 0,
        err_offset: int = 0,
        stdin: bool = False,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        collect: bool = True,
    ) -> CommandHandle:
        return CommandHandle(
            _call(
                self._inner.attach(
                    process_id,
                    out_offset=out_offset,
                    err_offset=err_offset,
                    stdin=stdin,
                    on_stdout=on_stdout,
                    on_stderr=on_stderr,
                    collect=collect,
                )
            )
        )

    def list(self) -> list[ProcessInfo]:
        return _call(self._inner.list())

    def wait(self, process_id: int) -> ExitStatus:
        return _call(self._inner.wait(process_id))

    def kill(self, process_id: int, *, signal: str | int = "KILL", group: bool = True) -> None:
        _call(self._inner.kill(process_id, signal=signal, group=group))


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


class Files:
    """``sandbox.files`` (see :class:`AsyncFiles`)."""

    def __init__(self, inner: AsyncFiles) -> None:
        self._inner = inner

    def read(
        self,
        path: str,
        *,
        offset: int = 0,
        length: int | None = None,
        max_bytes: int = DEFAULT_MAX_READ,
    ) -> bytes:
        return _call(self._inner.read(path, offset=offset, length=length, max_bytes=max_bytes))

    def read_text(self, path: str, *, encoding: str = "utf-8", errors: str = "strict") -> str:
        return _call(self._inner.read_text(path, encoding=encoding, errors=errors))

    def write(
        self,
        path: str,
        data: bytes | str,
        *,
        mode: int | None = None,
        create_parents: bool = True,
        if_exists: IfExists = "overwrite",
    ) -> int:
        return _call(
            self._inner.write(
                path, data, mode=mode, create_parents=create_parents, if_exists=if_exists
            )
        )

    def upload_file(
        self, local: str | os.PathLike[str], path: str, *, mode: int | None = None
    ) -> int:
        return _call(self._inner.upload_file(local, path, mode=mode))

    def download_file(
        self, path: str, local: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_DOWNLOAD
    ) -> int:
        return _call(self._inner.download_file(path, local, max_bytes=max_bytes))

    def stat(self, path: str) -> FileInfo:
        return _call(self._inner.stat(path))

    def exists(self, path: str) -> bool:
        return _call(self._inner.exists(path))

    def list(self, path: str = ".", *, depth: int = 1) -> list[FileInfo]:
        return _call(self._inner.list(path, depth=depth))

    def mkdir(self, path: str, *, mode: int | None = None) -> None:
        _call(self._inner.mkdir(path, mode=mode))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        _call(self._inner.remove(path, recursive=recursive))

    def rename(self, src: str, dst: str, *, overwrite: bool = False) -> None:
        _call(self._inner.rename(src, dst, overwrite=overwrite))

    def chmod(self, path: str, mode: int) -> None:
        _call(self._inner.chmod(path, mode))

    def glob(self, pattern: str, *, root: str = ".", limit: int | None = None) -> GlobResult:
        return _call(self._inner.glob(pattern, root=root, limit=limit))

    def grep(
        self,
        pattern: str,
        path: str = ".",
        *,
        regex: bool = False,
        ignore_case: bool = False,
        glob: str | None = None,
        limit: int | None = None,
    ) -> GrepResult:
        return _call(
            self._inner.grep(
                pattern, path, regex=regex, ignore_case=ignore_case, glob=glob, limit=limit
            )
        )

    def edit(self, path: str, old: str, new: str, *, replace_all: bool = False) -> int:
        return _call(self._inner.edit(path, old, new, replace_all=replace_all))

    def write_batch(
        self, files: Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]]
    ) -> builtins.list[WriteResult]:
        return _call(self._inner.write_batch(files))

    def read_batch(
        self, paths: Sequence[str], *, max_bytes: int = DEFAULT_MAX_READ
    ) -> builtins.list[ReadResult]:
        return _call(self._inner.read_batch(paths, max_bytes=max_bytes))

    def read_tar(
        self, path: str, *, exclude: Sequence[str] = (), max_bytes: int = DEFAULT_MAX_DOWNLOAD
    ) -> bytes:
        return _call(self._inner.read_tar(path, exclude=exclude, max_bytes=max_bytes))

    def write_tar(self, path: str, archive: bytes, *, gzip: bool = False) -> None:
        _call(self._inner.write_tar(path, archive, gzip=gzip))

    def upload_dir(self, local: str | os.PathLike[str], path: str) -> None:
        _call(self._inner.upload_dir(local, path))

    def download_dir(
        self,
        path: str,
        local: str | os.PathLike[str],
        *,
        exclude: Sequence[str] = (),
        max_bytes: int = DEFAULT_MAX_DOWNLOAD,
    ) -> builtins.list[str]:
        return _call(self._inner.download_dir(path, local, exclude=exclude, max_bytes=max_bytes))

    def watch(self, path: str, *, recursive: bool = True) -> Watch:
        return Watch(_call(self._inner.watch(path, recursive=recursive)))


class Pty:
    """``sandbox.pty`` (see :class:`AsyncPty`)."""

    def __init__(self, inner: AsyncPty) -> None:
        self._inner = inner

    def start(
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
    ) -> PtyHandle:
        return PtyHandle(
            _call(
                self._inner.start(
                    cmd,
                    cols=cols,
                    rows=rows,
                    term=term,
                    env=env,
                    cwd=cwd,
                    user=user,
                    timeout=timeout,
                    background=background,
                    tag=tag,
                    on_data=on_data,
                )
            )
        )


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


class Ports:
    """``sandbox.ports`` (see :class:`AsyncPorts`)."""

    def __init__(self, inner: AsyncPorts) -> None:
        self._inner = inner

    def list(self) -> list[ListeningPort]:
        return _call(self._inner.list())

    def preview_url(self, port: int) -> str:
        return _call(self._inner.preview_url(port))

    def preview_urls(self, port: int) -> tuple[str, str]:
        return _call(self._inner.preview_urls(port))

    def forward(self, port: int, *, local_port: int = 0, host: str = "127.0.0.1") -> Forward:
        return Forward(_call(self._inner.forward(port, local_port=local_port, host=host)))


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


class Sandbox:
    """A sandbox, driven with blocking calls: the twin of :class:`AsyncSandbox`, with the
    same methods and results."""

    def __init__(self, inner: AsyncSandbox) -> None:
        self._inner = inner
        self.commands = Commands(inner.commands)
        self.files = Files(inner.files)
        self.pty = Pty(inner.pty)
        self.ports = Ports(inner.ports)

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def info(self) -> SandboxInfo:
        return self._inner.info

    @property
    def async_sandbox(self) -> AsyncSandbox:
        """The async twin this wraps (its calls must run on the SDK's loop thread)."""
        return self._inner

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r})"

    @classmethod
    def create(
        cls,
        *,
        image: str | None = None,
        provider: str | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        ttl: float | None = None,
        idle_timeout: float | None = None,
        cpus: float | None = None,
        memory_bytes: int | None = None,
        pids: int | None = None,
        disk_bytes: int | None = None,
        network: Literal["none", "host"] | None = None,
        seccomp_unconfined: bool = False,
        get_or_create: bool = False,
        relay: str | None = None,
        token: str | None = None,
    ) -> Sandbox:
        return cls(
            _call(
                AsyncSandbox.create(
                    image=image,
                    provider=provider,
                    labels=labels,
                    env=env,
                    ttl=ttl,
                    idle_timeout=idle_timeout,
                    cpus=cpus,
                    memory_bytes=memory_bytes,
                    pids=pids,
                    disk_bytes=disk_bytes,
                    network=network,
                    seccomp_unconfined=seccomp_unconfined,
                    get_or_create=get_or_create,
                    relay=relay,
                    token=token,
                )
            )
        )

    @classmethod
    def get_or_create(cls, labels: Mapping[str, str], **kwargs: Any) -> Sandbox:
        return cls(_call(AsyncSandbox.get_or_create(labels, **kwargs)))

    @classmethod
    def connect(
        cls, sandbox_id: str, *, relay: str | None = None, token: str | None = None
    ) -> Sandbox:
        return cls(_call(AsyncSandbox.connect(sandbox_id, relay=relay, token=token)))

    @staticmethod
    def list(
        *,
        labels: Mapping[str, str] | None = None,
        relay: str | None = None,
        token: str | None = None,
    ) -> list[SandboxInfo]:
        return _call(AsyncSandbox.list(labels=labels, relay=relay, token=token))

    def refresh(self) -> SandboxInfo:
        return _call(self._inner.refresh())

    def renew(self, ttl: float) -> SandboxInfo:
        return _call(self._inner.renew(ttl))

    def delete(self) -> None:
        _call(self._inner.delete())

    kill = delete

    def close(self) -> None:
        """Closes the connection and the relay client; the sandbox keeps running."""
        _call(self._inner.aclose())

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def capabilities(self) -> frozenset[str]:
        return _call(self._inner.capabilities())

    def agent_info(self) -> AgentInfo:
        return _call(self._inner.agent_info())

    def run_code(
        self,
        code: str,
        language: Language = "python",
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        return _call(self._inner.run_code(code, language, env=env, cwd=cwd, timeout=timeout))

    def code_session(
        self,
        *,
        python: str = "python3",
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> CodeSession:
        return CodeSession(_call(self._inner.code_session(python=python, env=env, cwd=cwd)))
