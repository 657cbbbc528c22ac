"""``TetherTools``: the ``Toolkit`` an Agno ``Agent`` takes, with the tools of Agno's E2B
toolkit over the sandboxes of a ``SandboxManager``: stateful ``run_python_code`` (a code
session per sandbox: variables survive between calls), shell commands, background jobs with
statuses ``pending``/``running``/``done``/``cancelled``/``error``, files, directory watches,
``get_public_url``/``run_server`` (preview URLs through the relay), sandbox management,
``run_in_all_sandboxes`` and ``force_shutdown_all``; PNG figures and the chart data behind them
(``download_png_result``, ``download_chart_data``). Every tool returns a JSON string with a
``status`` of ``success`` or ``error``; a failing tool never raises, whatever fails (the relay,
the sandbox, a model's malformed argument): it returns its error, as Agno's E2B tools do.
``E2BToolkit`` is the same class under the name the E2B toolkit's page uses.

Host paths (``upload_file``, ``download_file_from_sandbox``, ``download_png_result``) are
confined to ``local_dir``: a model cannot make the toolkit read or write elsewhere on the host.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar, cast

from agno.tools import Toolkit

from ... import errors
from ..._landing import write_host_file
from ..._sync import CommandHandle
from .manager import MAX_TTL_S, SandboxManager, SandboxSlot

MAX_READ_BYTES = 10 << 20  # 10 MiB: the most read_file_content returns to a model
MAX_OUTPUT_BYTES = 1 << 20  # 1 MiB of output per command or job kept for the model
SERVER_POLL_S = 0.1  # run_server's interval between looks at the listening ports
MAX_WATCH_S = 60  # watch_directory's longest watch
KILL_WAIT_S = 30  # how long kill_job waits for a killed job to end


Tool = TypeVar("Tool", bound=Callable[..., str])


def _never_raises(tool: Tool) -> Tool:
    """A tool whose every failure is an ``error`` status: a model's tool call must get an
    answer it can act on, never an exception in the agent's loop. ``wraps`` keeps the
    signature and docstring Agno builds the tool's schema from."""

    @wraps(tool)
    def guarded(*args: Any, **kwargs: Any) -> str:
        try:
            return tool(*args, **kwargs)
        except Exception as exc:  # the contract: report, never raise
            return _err(f"{tool.__name__} failed: {type(exc).__name__}: {exc}")

    return cast(Tool, guarded)


def _ok(**fields: Any) -> str:
    return json.dumps({"status": "success", **fields}, default=str)


def _err(message: str, **fields: Any) -> str:
    return json.dumps({"status": "error", "message": message, **fields}, default=str)


@dataclass
class _Job:
    id: str
    sandbox_id: str
    kind: str
    command: str
    status: str = "pending"
    result: dict[str, Any] | None = None
    error: str | None = None
    handle: CommandHandle | None = None
    future: Future[None] | None = None
    cancelled: bool = False


class TetherTools(Toolkit):
    """Agno's E2B toolkit, on Tether sandboxes.

    ``manager`` defaults to a new :class:`SandboxManager`; with ``auto_create_default`` a
    sandbox is created up front, otherwise on the first tool that needs one. ``max_workers``
    bounds background jobs running at once. ``local_dir`` is the only host directory file
    transfers may touch (default: the current directory). ``python_env`` is extra environment
    for the Python session and Python jobs (``PYTHONPATH``...).
    """

    def __init__(
        self,
        manager: SandboxManager | None = None,
        *,
        auto_create_default: bool = False,
        max_workers: int = 4,
        local_dir: str | Path | None = None,
        python_env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.manager = manager or SandboxManager()
        self._python_env = dict(python_env or {})
        self.local_dir = Path(local_dir or Path.cwd()).resolve()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tether-job")
        self._jobs: dict[str, _Job] = {}
        self._jobs_lock = threading.Lock()
        if auto_create_default:
            self.manager.create()
        tools: list[Callable[..., Any]] = [
            self.run_python_code,
            self.run_python_code_background,
            self.run_in_all_sandboxes,
            self.run_command,
            self.run_command_background,
            self.get_job_status,
            self.kill_job,
            self.list_jobs,
            self.upload_file,
            self.download_file_from_sandbox,
            self.download_png_result,
            self.download_chart_data,
            self.list_files,
            self.read_file_content,
            self.write_file_content,
            self.watch_directory,
            self.get_public_url,
            self.run_server,
            self.create_sandbox,
            self.connect_sandbox,
            self.list_managed_sandboxes,
            self.set_sandbox_timeout,
            self.get_sandbox_status,
            self.shutdown_sandbox,
            self.shutdown_all_sandboxes,
            self.list_running_sandboxes,
            self.force_shutdown_all,
        ]
        kwargs.setdefault("name", "tether_tools")
        super().__init__(tools=tools, **kwargs)

    # --- helpers ----------------------------------------------------------------------------

    def _slot(self, sandbox_id: str | None) -> SandboxSlot:
        try:
            return self.manager.get_slot(sandbox_id)
        except LookupError:
            if sandbox_id is None:
                return self.manager.create()
            raise

    def _local(self, path: str | None, default_name: str) -> Path:
        target = (self.local_dir / (path or default_name)).resolve()
        if target != self.local_dir and self.local_dir not in target.parents:
            raise PermissionError(
                f"{path} is outside {self.local_dir}, the only host directory allowed"
            )
        return target

    # --- code -------------------------------------------------------------------------------

    @_never_raises
    def run_python_code(self, code: str, sandbox_id: str | None = None, timeout: int = 60) -> str:
        """Runs Python code in the sandbox's persistent Python session: variables, imports and
        functions defined earlier are still there. Returns stdout, stderr, the last
        expression's value, and any error with its traceback.

        Args:
            code: Python source to run.
            sandbox_id: The sandbox; the default one when omitted.
            timeout: Seconds before the cell is interrupted.
        """
        try:
            slot = self._slot(sandbox_id)
            if slot.code is None:
                slot.code = slot.sandbox.code_session(env=self._python_env or None)
            result = slot.code.run(code, timeout=timeout)
            slot.last_result = result
            out: dict[str, Any] = {
                "sandbox_id": slot.sandbox_id,
                "stdout": result.stdout,
                "stderr": result.stderr,
                "results": [] if result.value is None else [result.value],
                "images": len(result.images),
            }
            if result.error is not None:
                tb = "\n".join(result.error.traceback)
                return _err(f"{result.error.name}: {result.error.value}", traceback=tb, **out)
            return _ok(**out)
        except (errors.TetherError, LookupError) as exc:
            return _err(f"Error executing code: {exc}")

    @_never_raises
    def run_python_code_background(self, code: str, sandbox_id: str | None = None) -> str:
        """Starts Python code as a background job in a fresh interpreter; returns its job_id.
        Check it with get_job_status, stop it with kill_job.

        Args:
            code: Python source to run.
            sandbox_id: The sandbox; the default one when omitted.
        """
        return self._submit(["python3", "-c", code], sandbox_id, "python", code)

    @_never_raises
    def run_in_all_sandboxes(self, code: str, timeout_each: int = 30) -> str:
        """Runs the same Python code in every managed sandbox concurrently.

        Args:
            code: Python source to run.
            timeout_each: Seconds allowed in each sandbox.
        """
        slots = self.manager.slots()
        if not slots:
            return _err("no sandboxes are managed; create one first")
        with ThreadPoolExecutor(max_workers=len(slots)) as pool:
            futures = {
                s.sandbox_id: pool.submit(self.run_python_code, code, s.sandbox_id, timeout_each)
                for s in slots
            }
            results = {sid: json.loads(f.result()) for sid, f in futures.items()}
        return _ok(results=results)

    # --- commands and jobs ------------------------------------------------------------------

    @_never_raises
    def run_command(
        self,
        command: str,
        sandbox_id: str | None = None,
        background: bool = False,
        timeout: int = 60,
    ) -> str:
        """Runs a shell command in the sandbox and returns its stdout, stderr and exit code;
        with background=True it returns a job_id at once instead.

        Args:
            command: The shell command (run with /bin/sh -c).
            sandbox_id: The sandbox; the default one when omitted.
            background: Start it as a background job.
            timeout: Seconds before the command is killed (exit code 124).
        """
        if background:
            return self.run_command_background(command, sandbox_id)
        try:
            slot = self._slot(sandbox_id)
            r = slot.sandbox.commands.run(command, timeout=timeout, output_limit=MAX_OUTPUT_BYTES)
        except (errors.TetherError, LookupError) as exc:
            return _err(f"Error executing command: {exc}")
        output = {"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code}
        if r.timed_out:
            output["timed_out"] = True
        return _ok(sandbox_id=slot.sandbox_id, output=output)

    @_never_raises
    def run_command_background(self, command: str, sandbox_id: str | None = None) -> str:
        """Starts a shell command as a background job; returns its job_id.

        Args:
            command: The shell command.
            sandbox_id: The sandbox; the default one when omitted.
        """
        return self._submit(command, sandbox_id, "command", command)

    def _submit(self, cmd: str | list[str], sandbox_id: str | None, kind: str, text: str) -> str:
        try:
            slot = self._slot(sandbox_id)
        except (errors.TetherError, LookupError) as exc:
            return _err(str(exc))
        job = _Job(
            id=f"job-{uuid.uuid4().hex[:12]}", sandbox_id=slot.sandbox_id, kind=kind, command=text
        )
        with self._jobs_lock:
            self._jobs[job.id] = job
        job.future = self._pool.submit(self._run_job, job, slot, cmd)
        return _ok(job_id=job.id, sandbox_id=slot.sandbox_id)

    def _run_job(self, job: _Job, slot: SandboxSlot, cmd: str | list[str]) -> None:
        if job.cancelled:
            return
        try:
            # A background process outlives a dropped connection; its handle re-attaches.
            env = self._python_env if job.kind == "python" and self._python_env else None
            job.handle = slot.sandbox.commands.start(
                cmd, background=True, tag=job.id, env=env, output_limit=MAX_OUTPUT_BYTES
            )
            job.status = "running"
            if job.cancelled:
                job.handle.kill()
            r = job.handle.wait()
            if job.cancelled:
                job.status = "cancelled"
                return
            job.result = {"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code}
            job.status = "done"
        except Exception as exc:  # reported through get_job_status, as a job's outcome
            job.error = str(exc)
            job.status = "cancelled" if job.cancelled else "error"

    @_never_raises
    def get_job_status(self, job_id: str) -> str:
        """A background job's status: pending, running, done (with its result), cancelled, or
        error (with the error).

        Args:
            job_id: The id run_command_background or run_python_code_background returned.
        """
        with self._jobs_lock:
            job = self._jobs.get(job_id)
        if job is None:
            return _err(f"no job {job_id}; list_jobs shows the known ones")
        return json.dumps(_job_view(job))

    @_never_raises
    def kill_job(self, job_id: str) -> str:
        """Cancels a background job (kills its process).

        Args:
            job_id: The job to cancel.
        """
        with self._jobs_lock:
            job = self._jobs.get(job_id)
        if job is None:
            return _err(f"no job {job_id}")
        if job.status in ("done", "error", "cancelled"):
            return json.dumps({**_job_view(job), "message": "the job had already ended"})
        job.cancelled = True
        if job.future is not None and job.future.cancel():
            job.status = "cancelled"
        elif job.handle is not None:
            try:
                job.handle.kill()
            except errors.TetherError as exc:
                return _err(f"could not kill job {job_id}: {exc}")
        if job.future is not None and not job.future.cancelled():
            try:
                job.future.result(timeout=KILL_WAIT_S)
            except FutureTimeout:  # concurrent.futures' own class before Python 3.11
                return _err(f"job {job_id} was killed but has not ended after {KILL_WAIT_S} s")
        return json.dumps(_job_view(job))

    @_never_raises
    def list_jobs(self) -> str:
        """Every background job and its status."""
        with self._jobs_lock:
            jobs = list(self._jobs.values())
        return _ok(jobs=[_job_view(j) for j in jobs])

    # --- files ------------------------------------------------------------------------------

    @_never_raises
    def upload_file(
        self, local_path: str, sandbox_id: str | None = None, sandbox_path: str | None = None
    ) -> str:
        """Uploads a file from the host's working directory into the sandbox.

        Args:
            local_path: The host file, relative to the toolkit's local directory.
            sandbox_id: The sandbox; the default one when omitted.
            sandbox_path: Where to put it; its name in the working directory when omitted.
        """
        try:
            src = self._local(local_path, "")
            dest = sandbox_path or src.name
            slot = self._slot(sandbox_id)
            slot.sandbox.files.upload_file(src, dest)
        except (OSError, errors.TetherError, LookupError) as exc:
            return _err(f"Error uploading file: {exc}")
        return _ok(sandbox_path=dest, sandbox_id=slot.sandbox_id)

    @_never_raises
    def download_file_from_sandbox(
        self, sandbox_path: str, sandbox_id: str | None = None, local_path: str | None = None
    ) -> str:
        """Downloads a sandbox file into the host's working directory.

        Args:
            sandbox_path: The file in the sandbox.
            sandbox_id: The sandbox; the default one when omitted.
            local_path: Where to save it, relative to the local directory; its name when omitted.
        """
        try:
            dest = self._local(local_path, Path(sandbox_path).name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            size = self._slot(sandbox_id).sandbox.files.download_file(sandbox_path, dest)
        except (OSError, errors.TetherError, LookupError) as exc:
            return _err(f"Error downloading file: {exc}")
        return _ok(local_path=str(dest), bytes=size)

    @_never_raises
    def download_png_result(
        self,
        result_index: int = 0,
        sandbox_id: str | None = None,
        output_path: str | None = None,
        agent: Any = None,
    ) -> str:
        """Saves a PNG figure from the last run_python_code (e.g. matplotlib) on the host.

        Args:
            result_index: Which figure of the last run.
            sandbox_id: The sandbox; the default one when omitted.
            output_path: Where to save it, relative to the local directory.
        """
        # ``agent`` (Agno passes the calling agent) is accepted for the E2B toolkit's call
        # shape; the figure is a file in the local directory, not an agent artifact.
        try:
            slot = self.manager.get_slot(sandbox_id)
            images = slot.last_result.images if slot.last_result else []
            if not 0 <= result_index < len(images):
                return _err(f"the last run made {len(images)} figure(s); no index {result_index}")
            dest = self._local(output_path, f"figure-{slot.sandbox_id}-{result_index}.png")
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_host_file(dest, images[result_index])
        except (OSError, LookupError) as exc:
            return _err(f"Error saving the figure: {exc}")
        return _ok(file_path=str(dest), bytes=len(images[result_index]))

    @_never_raises
    def download_chart_data(
        self,
        result_index: int = 0,
        sandbox_id: str | None = None,
        output_path: str | None = None,
        add_as_artifact: bool = True,
        agent: Any = None,
    ) -> str:
        """Saves the data behind a chart from the last run_python_code (a matplotlib figure's
        type, title, axis labels and series) as JSON on the host, and its PNG beside it.

        Args:
            result_index: Which figure of the last run.
            sandbox_id: The sandbox; the default one when omitted.
            output_path: Where to save the JSON, relative to the local directory.
            add_as_artifact: Save the chart's PNG too (same name, .png).
        """
        try:
            slot = self.manager.get_slot(sandbox_id)
            charts = slot.last_result.charts if slot.last_result else []
            if not 0 <= result_index < len(charts):
                return _err(f"the last run made {len(charts)} chart(s); no index {result_index}")
            chart = charts[result_index]
            dest = self._local(output_path, f"chart-data-{slot.sandbox_id}-{result_index}.json")
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_host_file(dest, json.dumps(chart, indent=2, default=str).encode())
            out: dict[str, Any] = {
                "chart_path": str(dest),
                "type": chart.get("type", "unknown"),
                "title": chart.get("title"),
                "x_label": chart.get("x_label"),
                "y_label": chart.get("y_label"),
            }
            images = slot.last_result.images if slot.last_result else []
            if add_as_artifact and result_index < len(images):
                png = dest.with_suffix(".png")
                write_host_file(png, images[result_index])
                out["image_path"] = str(png)
        except (OSError, LookupError) as exc:
            return _err(f"Error saving the chart data: {exc}")
        return _ok(**out)

    @_never_raises
    def list_files(self, directory_path: str = ".", sandbox_id: str | None = None) -> str:
        """Lists a sandbox directory: names, kinds and sizes.

        Args:
            directory_path: The directory; the working directory when omitted.
            sandbox_id: The sandbox; the default one when omitted.
        """
        try:
            entries = self._slot(sandbox_id).sandbox.files.list(directory_path)
        except (errors.TetherError, LookupError) as exc:
            return _err(f"Error listing files: {exc}")
        return _ok(
            path=directory_path,
            entries=[{"name": e.path, "type": e.kind, "size": e.size} for e in entries],
        )

    @_never_raises
    def read_file_content(
        self, file_path: str, sandbox_id: str | None = None, encoding: str = "utf-8"
    ) -> str:
        """Reads a text file from the sandbox.

        Args:
            file_path: The file.
            sandbox_id: The sandbox; the default one when omitted.
            encoding: Its text encoding.
        """
        try:
            data = self._slot(sandbox_id).sandbox.files.read(file_path, max_bytes=MAX_READ_BYTES)
        except (errors.TetherError, LookupError) as exc:
            return _err(f"Error reading file: {exc}")
        try:
            return _ok(path=file_path, content=data.decode(encoding))
        except (UnicodeDecodeError, LookupError):
            return _err(
                f"{file_path} is binary ({len(data)} bytes); use download_file_from_sandbox"
            )

    @_never_raises
    def write_file_content(
        self, file_path: str, content: str, sandbox_id: str | None = None
    ) -> str:
        """Writes a text file in the sandbox (parent directories are created).

        Args:
            file_path: The file.
            content: Its new text.
            sandbox_id: The sandbox; the default one when omitted.
        """
        try:
            n = self._slot(sandbox_id).sandbox.files.write(file_path, content)
        except (errors.TetherError, LookupError) as exc:
            return _err(f"Error writing file: {exc}")
        return _ok(path=file_path, bytes=n)

    @_never_raises
    def watch_directory(
        self, directory_path: str, duration_seconds: int = 5, sandbox_id: str | None = None
    ) -> str:
        """Watches a sandbox directory for changes and lists those seen.

        Args:
            directory_path: The directory.
            duration_seconds: How long to watch (at most 60).
            sandbox_id: The sandbox; the default one when omitted.
        """
        changes: list[str] = []
        try:
            watch = self._slot(sandbox_id).sandbox.files.watch(directory_path)
            deadline = time.monotonic() + min(max(duration_seconds, 0), MAX_WATCH_S)
            try:
                while (left := deadline - time.monotonic()) > 0:
                    event = watch.next(timeout=left)
                    if event is None:
                        break
                    changes.append(f"{event.kind} {event.path}")
            finally:
                watch.close()
        except (errors.TetherError, LookupError) as exc:
            return _err(f"Error watching directory: {exc}")
        return _ok(path=directory_path, changes=changes)

    # --- ports ------------------------------------------------------------------------------

    @_never_raises
    def get_public_url(self, port: int, sandbox_id: str | None = None) -> str:
        """A URL that reaches a service listening on a port of the sandbox.

        Args:
            port: The port inside the sandbox.
            sandbox_id: The sandbox; the default one when omitted.
        """
        try:
            url = self._slot(sandbox_id).sandbox.ports.preview_url(int(port))
        except (errors.TetherError, LookupError, ValueError) as exc:
            return _err(f"Error getting public URL: {exc}")
        return _ok(url=url, port=port)

    @_never_raises
    def run_server(
        self, command: str, port: int, sandbox_id: str | None = None, wait_seconds: int = 10
    ) -> str:
        """Starts a server in the background, waits until it listens on the port, and returns
        its public URL.

        Args:
            command: The command that starts the server.
            port: The port it listens on.
            sandbox_id: The sandbox; the default one when omitted.
            wait_seconds: The longest wait for it to listen.
        """
        started = json.loads(self.run_command_background(command, sandbox_id))
        if started["status"] != "success":
            return json.dumps(started)
        job = self._jobs[started["job_id"]]
        sb = self.manager.get_slot(job.sandbox_id).sandbox
        deadline = time.monotonic() + max(wait_seconds, 0)
        try:
            while not any(p.port == port for p in sb.ports.list()):
                if job.status in ("done", "error", "cancelled"):
                    view = {k: v for k, v in _job_view(job).items() if k != "status"}
                    return _err(f"the server exited before listening on {port}", **view)
                if time.monotonic() > deadline:
                    return _err(
                        f"nothing listens on {port} after {wait_seconds} s",
                        job_id=job.id,
                    )
                time.sleep(SERVER_POLL_S)
            url = sb.ports.preview_url(port)
        except errors.TetherError as exc:
            return _err(f"Error starting server: {exc}", job_id=job.id)
        return _ok(url=url, port=port, job_id=job.id, sandbox_id=job.sandbox_id)

    # --- sandboxes --------------------------------------------------------------------------

    @_never_raises
    def create_sandbox(
        self,
        timeout: int | None = None,
        metadata: dict[str, str] | None = None,
        set_as_default: bool = False,
    ) -> str:
        """Creates a new sandbox.

        Args:
            timeout: Its lifetime in seconds (at most 3600).
            metadata: Labels to find it by.
            set_as_default: Make it the default sandbox.
        """
        try:
            slot = self.manager.create(timeout, metadata)
            if set_as_default:
                self.manager.set_default(slot.sandbox_id)
        except errors.TetherError as exc:
            return _err(f"Error creating sandbox: {exc}")
        return _ok(sandbox_id=slot.sandbox_id, metadata=slot.metadata)

    @_never_raises
    def connect_sandbox(self, sandbox_id: str) -> str:
        """Manages an existing sandbox by its id.

        Args:
            sandbox_id: The sandbox.
        """
        try:
            slot = self.manager.connect(sandbox_id)
        except errors.TetherError as exc:
            return _err(f"Error connecting: {exc}")
        return _ok(sandbox_id=slot.sandbox_id, metadata=slot.metadata)

    @_never_raises
    def list_managed_sandboxes(self) -> str:
        """The sandboxes this toolkit manages."""
        return _ok(
            sandboxes=[
                {"sandbox_id": s.sandbox_id, "metadata": s.metadata, "created_at": s.created_at}
                for s in self.manager.slots()
            ]
        )

    @_never_raises
    def set_sandbox_timeout(self, timeout: int, sandbox_id: str | None = None) -> str:
        """Extends the sandbox's life to ``timeout`` seconds from now.

        Args:
            timeout: Seconds from now (at most 3600).
            sandbox_id: The sandbox; the default one when omitted.
        """
        try:
            info = self._slot(sandbox_id).sandbox.renew(min(int(timeout), MAX_TTL_S))
        except (errors.TetherError, LookupError) as exc:
            return _err(f"Error updating sandbox timeout: {exc}")
        return _ok(sandbox_id=info.id, expires_at=(info.expires_ms or 0) / 1000)

    @_never_raises
    def get_sandbox_status(self, sandbox_id: str | None = None) -> str:
        """The sandbox's id, state, labels and expiry.

        Args:
            sandbox_id: The sandbox; the default one when omitted.
        """
        try:
            info = self.manager.get_slot(sandbox_id).sandbox.refresh()
        except (errors.TetherError, LookupError) as exc:
            return _err(f"Error getting sandbox status: {exc}")
        return _ok(
            sandbox_id=info.id,
            state=info.state,
            metadata=info.labels,
            expires_at=(info.expires_ms or 0) / 1000 or None,
        )

    @_never_raises
    def shutdown_sandbox(self, sandbox_id: str | None = None) -> str:
        """Deletes a sandbox.

        Args:
            sandbox_id: The sandbox; the default one when omitted.
        """
        try:
            return json.dumps(self.manager.shutdown(sandbox_id))
        except (errors.TetherError, LookupError) as exc:
            return _err(f"Error shutting down sandbox: {exc}")

    @_never_raises
    def shutdown_all_sandboxes(self) -> str:
        """Deletes every sandbox this toolkit manages."""
        return json.dumps(self.manager.shutdown_all())

    @_never_raises
    def list_running_sandboxes(self) -> str:
        """Every sandbox on the relay this token can see."""
        try:
            return _ok(sandboxes=self.manager.list_account_sandboxes())
        except errors.TetherError as exc:
            return _err(f"Error listing sandboxes: {exc}")

    @_never_raises
    def force_shutdown_all(self) -> str:
        """Deletes every sandbox this token can see on the relay, managed by this toolkit or
        not. Use with caution."""
        return json.dumps(self.manager.force_shutdown_all())


E2BToolkit = TetherTools
"""The E2B toolkit page's name for this class: ``E2BToolkit(manager, auto_create_default=False)``."""


def _job_view(job: _Job) -> dict[str, Any]:
    view: dict[str, Any] = {
        "job_id": job.id,
        "sandbox_id": job.sandbox_id,
        "kind": job.kind,
        "status": job.status,
    }
    if job.result is not None:
        view["result"] = job.result
    if job.error is not None:
        view["error"] = job.error
    return view


__all__ = ["E2BToolkit", "TetherTools"]
