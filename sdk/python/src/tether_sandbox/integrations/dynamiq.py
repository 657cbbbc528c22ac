"""Dynamiq on Tether: a ``dynamiq.sandboxes.Sandbox`` backend.

``TetherSandbox`` behaves as Dynamiq's E2B and Daytona backends do: the sandbox is created on
first use (or reconnected when ``sandbox_id`` is given), creation and reconnection retry rate
limits with exponential backoff (``creation_error_handling``), ``{base_path}/input`` receives
the run's uploaded files and ``{base_path}/output`` is what the agent hands back, and
``get_sandbox_info(port)`` returns a preview URL that reaches the port through the relay.
``get_tools`` gives an agent the shell, file write/read, todo and sandbox-info tools. File
operations are the agent's native ones, so they need nothing in the image but the agent.

Dynamiq assumes E2B's home, ``/home/user``, in its defaults: an agent stores large tool outputs
under ``/home/user/.tools`` and the page's examples read ``/home/user/input/...``. A sandbox's
root is read-only (``/workspace`` and ``/tmp`` are writable), so the backend's file operations
(``store``, ``upload_file``, ``retrieve``, ``exists``, ``list_files``, ``delete_file``) take
paths under ``home_alias`` (``/home/user``) to the same place under ``base_path``: the agent's
large outputs land in ``{base_path}/.tools`` and read back at the path the agent was told.
Shell commands see them under ``base_path``. ``home_alias=None`` turns this off (an image with
a writable ``/home/user``; a ``base_path`` at or under ``/home/user`` does too).

Attach it with ``Agent(..., sandbox=SandboxConfig(enabled=True, backend=TetherSandbox()))``.
Install with ``pip install 'tether-sandbox[dynamiq]'``.
"""

from __future__ import annotations

import os
import posixpath
import threading
from functools import partial
from typing import Any

from dynamiq.connections.connections import BaseConnection
from dynamiq.nodes import Node
from dynamiq.nodes.tools.code_interpreter import SandboxCreationErrorHandling
from dynamiq.sandboxes.base import Sandbox, SandboxInfo, ShellCommandResult
from dynamiq.sandboxes.exceptions import SandboxConnectionError
from pydantic import ConfigDict, Field, PrivateAttr
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from .. import errors
from .._sync import Sandbox as TetherSdkSandbox

E2B_HOME = "/home/user"  # the home Dynamiq's defaults assume (base_path, its .tools store)
LIST_DEPTH = 8  # how deep list_files looks under a directory
MAX_RETRIEVE_BYTES = 256 << 20  # 256 MiB: the largest file retrieve() reads into memory
MAX_OUTPUT_BYTES = 10 << 20  # 10 MiB of output per shell command
RETRYABLE = (errors.RateLimited, errors.RelayUnavailable, errors.RelayUnreachable)


class TetherConnection(BaseConnection):
    """Where the relay is and the token for it (``TETHER_RELAY`` / ``TETHER_TOKEN`` by
    default). The token is never serialized."""

    relay: str | None = Field(default_factory=partial(os.environ.get, "TETHER_RELAY"))
    token: str | None = Field(
        default_factory=partial(os.environ.get, "TETHER_TOKEN"), exclude=True, repr=False
    )

    def connect(self) -> None:
        """Nothing to open: each sandbox opens its own connection when first used."""

    @property
    def auth(self) -> dict[str, Any]:
        return {"relay": self.relay, "token": self.token}


class TetherSandbox(Sandbox):
    """A Dynamiq sandbox backend on a Tether sandbox.

    ``timeout`` is the sandbox's TTL in seconds; ``image``, ``envs``, ``labels``,
    ``idle_timeout`` and ``memory_bytes`` shape a new sandbox; ``sandbox_id`` reconnects to
    an existing one instead.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    connection: TetherConnection = Field(default_factory=TetherConnection)
    base_path: str = Field(default="/workspace", description="Base path in the sandbox filesystem.")
    timeout: int = 3600
    image: str | None = Field(default=None, description="Image (`oci:PATH`, provider template).")
    envs: dict[str, str] | None = Field(default=None, description="Environment of the sandbox.")
    labels: dict[str, str] | None = Field(default=None, description="Labels to find it by.")
    idle_timeout: int | None = Field(
        default=None, description="Delete after this many idle seconds."
    )
    memory_bytes: int | None = Field(default=None, description="Memory limit in bytes.")
    sandbox_id: str | None = Field(default=None, description="An existing sandbox to reconnect to.")
    home_alias: str | None = Field(
        default=E2B_HOME,
        description="File paths under this directory are resolved under base_path instead.",
    )
    creation_error_handling: SandboxCreationErrorHandling = Field(
        default_factory=SandboxCreationErrorHandling,
        description="Retry and backoff for creation and reconnection.",
    )
    _sandbox: TetherSdkSandbox | None = PrivateAttr(default=None)
    _sandbox_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def to_dict_exclude_params(self) -> dict[str, bool]:
        return super().to_dict_exclude_params | {"envs": True}

    def _resolve_path(self, file_path: str) -> str:
        """``file_path`` in the sandbox: relative to ``base_path``, and under ``base_path``
        when it is under ``home_alias`` (see the module's docstring)."""
        path = super()._resolve_path(file_path)
        home = (self.home_alias or "").rstrip("/")
        base = self.base_path.rstrip("/")
        if not home or base == home or base.startswith(home + "/"):
            return path
        norm = posixpath.normpath(path)
        if norm == home or norm.startswith(home + "/"):
            return base + norm[len(home) :]
        return path

    @property
    def current_sandbox_id(self) -> str | None:
        """The sandbox's id once it exists: save it to reconnect later."""
        return self.sandbox_id

    # --- lifecycle -----------------------------------------------------------------------------

    def _retrying(self, fn: Any) -> Any:
        cfg = self.creation_error_handling
        return retry(
            retry=retry_if_exception_type(RETRYABLE),
            stop=stop_after_attempt(cfg.max_retries),
            wait=wait_exponential_jitter(
                initial=cfg.initial_wait_seconds,
                max=cfg.max_wait_seconds,
                exp_base=cfg.exponential_base,
                jitter=cfg.jitter,
            ),
            reraise=True,
        )(fn)

    def _ensure_sandbox(self) -> TetherSdkSandbox:
        """The sandbox, created or reconnected on first use (once, whatever the threads)."""
        if self._sandbox is not None:
            return self._sandbox
        with self._sandbox_lock:
            if self._sandbox is not None:
                return self._sandbox
            auth = self.connection.auth
            if self.sandbox_id:
                sandbox_id = self.sandbox_id
                try:
                    sb = self._retrying(lambda: TetherSdkSandbox.connect(sandbox_id, **auth))()
                except errors.TetherError as exc:
                    raise SandboxConnectionError(sandbox_id, cause=exc, provider="Tether") from exc
            else:
                sb = self._retrying(
                    lambda: TetherSdkSandbox.create(
                        image=self.image,
                        env=self.envs,
                        labels=self.labels,
                        ttl=self.timeout,
                        idle_timeout=self.idle_timeout,
                        memory_bytes=self.memory_bytes,
                        **auth,
                    )
                )()
                self.sandbox_id = sb.id
            base = self.base_path.rstrip("/")
            for directory in (base, f"{base}/input", f"{base}/output"):
                sb.files.mkdir(directory)
            self._sandbox = sb
            return sb

    @property
    def supports_views(self) -> bool:
        return True

    def ensure_started(self) -> str | None:
        self._ensure_sandbox()
        return self.sandbox_id

    def create_view(self, base_path: str, sandbox_id: str | None = None) -> TetherSandbox:
        """A sibling bound to another ``base_path`` in the same sandbox."""
        return TetherSandbox(
            connection=self.connection,
            sandbox_id=sandbox_id or self.ensure_started(),
            base_path=base_path,
            home_alias=self.home_alias,
            timeout=self.timeout,
            creation_error_handling=self.creation_error_handling,
        )

    def close(self, kill: bool = False) -> None:
        """Disconnects; ``kill=True`` deletes the sandbox too."""
        sb, self._sandbox = self._sandbox, None
        try:
            if sb is None and kill and self.sandbox_id:
                sb = TetherSdkSandbox.connect(self.sandbox_id, **self.connection.auth)
            if sb is None:
                return
            if kill:
                sb.delete()
                self.sandbox_id = None
            else:
                sb.close()
        except (errors.SandboxNotFound, errors.SandboxGone):
            self.sandbox_id = None

    def __enter__(self) -> TetherSandbox:
        self._ensure_sandbox()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- commands ------------------------------------------------------------------------------

    def run_command_shell(
        self, command: str, timeout: int = 60, run_in_background_enabled: bool = False
    ) -> ShellCommandResult:
        """Runs ``command`` with ``/bin/sh -c`` in ``base_path``; in the background it keeps
        running (and is listed by ``sb.commands.list()``) after this returns."""
        try:
            sb = self._ensure_sandbox()
            if run_in_background_enabled:
                handle = sb.commands.start(
                    command, background=True, cwd=self.base_path, collect=False
                )
                handle.detach()
                return ShellCommandResult(background=True, exit_code=None)
            r = sb.commands.run(
                command, timeout=timeout, cwd=self.base_path, output_limit=MAX_OUTPUT_BYTES
            )
        except (errors.TetherError, SandboxConnectionError) as exc:
            return ShellCommandResult(error=str(exc))
        return ShellCommandResult(
            stdout=r.stdout,
            stderr=r.stderr,
            exit_code=r.exit_code,
            error=f"the command timed out after {timeout} s" if r.timed_out else None,
        )

    # --- files ---------------------------------------------------------------------------------

    def upload_file(
        self,
        file_name: str,
        content: bytes,
        destination_path: str | None = None,
        ensure_parent_dirs: bool = True,
    ) -> str:
        dest = self._resolve_path(destination_path or file_name)
        self._ensure_sandbox().files.write(dest, content, create_parents=ensure_parent_dirs)
        return dest

    def list_files(self, target_dir: str | None = None) -> list[str]:
        """Absolute paths of the files under ``target_dir`` (default ``base_path``), at most
        ``max_output_files``; a missing directory has none."""
        root = self._resolve_path(target_dir or self.base_path)
        try:
            entries = self._ensure_sandbox().files.list(root, depth=LIST_DEPTH)
        except (errors.NotFound, errors.NotADirectory):
            return []
        files = sorted(posixpath.join(root, e.path) for e in entries if e.kind == "file")
        return files[: self.max_output_files]

    def exists(self, file_path: str) -> bool:
        return self._ensure_sandbox().files.exists(self._resolve_path(file_path))

    def retrieve(self, file_path: str) -> bytes:
        """The file's bytes; whatever the sandbox holds, at most ``MAX_RETRIEVE_BYTES`` are
        read into memory (larger files raise ``TooLarge``)."""
        try:
            return self._ensure_sandbox().files.read(
                self._resolve_path(file_path), max_bytes=MAX_RETRIEVE_BYTES
            )
        except errors.NotFound as exc:
            raise FileNotFoundError(str(exc)) from exc

    def delete_file(self, file_path: str) -> bool:
        try:
            self._ensure_sandbox().files.remove(self._resolve_path(file_path))
        except errors.NotFound:
            return True
        except errors.TetherError:
            return False
        return True

    # --- agent-facing --------------------------------------------------------------------------

    def get_sandbox_info(self, port: int | None = None) -> SandboxInfo:
        public_host = public_url = public_url_error = None
        if port is not None:
            try:
                public_url = self._ensure_sandbox().ports.preview_url(int(port))
                public_host = public_url.split("://", 1)[-1].split("/", 1)[0]
            except (errors.TetherError, ValueError) as exc:
                public_url_error = str(exc)
        return SandboxInfo(
            base_path=self.base_path,
            sandbox_id=self.sandbox_id,
            public_host=public_host,
            public_url=public_url,
            public_url_error=public_url_error,
        )

    def get_tools(self, llm: Any = None) -> list[Node]:
        """The shell, file write, todo and sandbox-info tools (file read too, given ``llm``)."""
        from dynamiq.nodes.tools.file_tools import FileReadTool, FileWriteTool
        from dynamiq.nodes.tools.todo_tools import TodoWriteTool
        from dynamiq.sandboxes.tools.sandbox_info import SandboxInfoTool
        from dynamiq.sandboxes.tools.shell import SandboxShellTool

        tools: list[Node] = [
            SandboxShellTool(sandbox=self),
            FileWriteTool(file_store=self, absolute_file_paths_allowed=True),
            TodoWriteTool(file_store=self),
            SandboxInfoTool(sandbox=self),
        ]
        if llm is not None:
            tools.append(FileReadTool(file_store=self, llm=llm, absolute_file_paths_allowed=True))
        return tools
