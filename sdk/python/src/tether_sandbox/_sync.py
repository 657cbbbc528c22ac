"""The blocking API: ``Sandbox`` and its parts, each a thin shell around its async twin.

Every call is handed to one private event loop running on a daemon thread (the portal) and
waited for, so the sync and async APIs share all their logic and result types. Callbacks
(``on_stdout``...) run on that loop's thread.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from ._commands import AsyncCommands, Command, OutputCallback
from ._constants import DEFAULT_MAX_DOWNLOAD, DEFAULT_MAX_READ
from ._files import AsyncFiles, IfExists

# _call and _Portal are re-exported: the framework integrations run coroutines through them.
from ._portal import _call as _call
from ._portal import _Portal as _Portal
from ._ports import AsyncPorts
from ._pty import AsyncPty
from ._sandbox import AsyncSandbox, Language

# Re-exported: the handles were first defined here, and the integrations import them from here.
from ._sync_handles import CodeSession as CodeSession
from ._sync_handles import CommandHandle as CommandHandle
from ._sync_handles import Forward as Forward
from ._sync_handles import PtyHandle as PtyHandle
from ._sync_handles import Watch as Watch
from .types import (
    AgentInfo,
    CommandResult,
    ExitStatus,
    FileInfo,
    GlobResult,
    GrepResult,
    IdleAction,
    ListeningPort,
    NetworkMode,
    ProcessInfo,
    ReadResult,
    SandboxInfo,
    Secret,
    WriteResult,
)


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
        template: str | None = None,
        provider: str | None = None,
        labels: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        ttl: float | None = None,
        idle_timeout: float | None = None,
        cpus: float | None = None,
        memory_bytes: int | None = None,
        pids: int | None = None,
        disk_bytes: int | None = None,
        network: NetworkMode | None = None,
        allow_hosts: Sequence[str] | None = None,
        allow_cidrs: Sequence[str] | None = None,
        secrets: Sequence[Secret] | None = None,
        seccomp_unconfined: bool = False,
        on_idle: IdleAction | None = None,
        auto_resume: bool | None = None,
        get_or_create: bool = False,
        relay: str | None = None,
        token: str | None = None,
    ) -> Sandbox:
        return cls(
            _call(
                AsyncSandbox.create(
                    image=image,
                    template=template,
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
                    allow_hosts=allow_hosts,
                    allow_cidrs=allow_cidrs,
                    secrets=secrets,
                    seccomp_unconfined=seccomp_unconfined,
                    on_idle=on_idle,
                    auto_resume=auto_resume,
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

    def pause(self) -> SandboxInfo:
        """Pauses the sandbox (see :meth:`AsyncSandbox.pause`)."""
        return _call(self._inner.pause())

    def resume(self) -> SandboxInfo:
        """Resumes a paused sandbox (see :meth:`AsyncSandbox.resume`)."""
        return _call(self._inner.resume())

    def stop(self) -> SandboxInfo:
        """Stops the sandbox, keeping its files (see :meth:`AsyncSandbox.stop`)."""
        return _call(self._inner.stop())

    def start(self) -> SandboxInfo:
        """Starts a stopped sandbox again (see :meth:`AsyncSandbox.start`)."""
        return _call(self._inner.start())

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
