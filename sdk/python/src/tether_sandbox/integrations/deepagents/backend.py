"""``TetherSandbox``: a deepagents ``BaseSandbox`` whose file tools are the agent's native
operations.

It overrides every method deepagents' ``BaseSandbox`` would otherwise build from ``python3 -c``
scripts over ``execute`` (``ls``, ``read``, ``write``, ``edit``, ``grep``, ``glob``, ``delete``)
with one protocol request each, so it works on images without python3 and pays one round trip
per call. Every method has its async twin, which awaits the SDK's own loop instead of parking a
worker thread. Results follow deepagents' own (paging, error strings, glob rules).

deepagents offloads large tool results and old conversation history into files under its
artifacts root, ``/`` unless the backend is a ``CompositeBackend`` with another
``artifacts_root``: ``/large_tool_results``, ``/conversation_history`` and ``/blobs``. A
sandbox's root is read-only (``/workspace`` and ``/tmp`` are writable), so those writes would
fail and the whole result would stay in the model's context. The backend therefore keeps those
three directories under ``artifacts_dir`` (``/tmp/deepagents`` by default): every file tool
sees them at the paths deepagents names (``read_file("/large_tool_results/call-1")`` works),
while in ``execute`` they are under ``artifacts_dir`` (``cat
/tmp/deepagents/large_tool_results/call-1``). ``artifacts_dir=None`` turns this off, for an
image whose root is writable.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import datetime
import posixpath
import re
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

from deepagents.backends.protocol import (
    DeleteResult,
    EditResult,
    ExecuteResponse,
    FileData,
    FileDownloadResponse,
    FileInfo,
    FileUploadResponse,
    GlobResult,
    GrepMatch,
    GrepResult,
    LsResult,
    ReadResult,
    WriteResult,
)
from deepagents.backends.sandbox import BaseSandbox

from ... import errors
from ..._sandbox import AsyncSandbox
from ..._sync import Sandbox
from ...types import FileInfo as TetherFileInfo
from .._bridge import run_async, run_sync

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30 * 60  # a command's timeout when deepagents gives none
MAX_OUTPUT_BYTES = 10 << 20  # 10 MiB of combined output per command, then `truncated`
MAX_READ_BYTES = 256 << 20  # 256 MiB: the largest file `read` pages through in memory
MAX_BINARY_BYTES = 500 * 1024  # as deepagents: binary files above this are not returned
MAX_PAGE_BYTES = 500 * 1024  # as deepagents: one `read` page's text is capped here
MAX_GREP_MATCHES = 10_000  # matches returned when deepagents asks for no cap
MAX_GLOB_MATCHES = 10_000  # as deepagents' glob script
MAX_BRACE_EXPANSIONS = 1_000  # as deepagents' glob script
STAT_CONCURRENCY = 32  # glob's per-match stats in flight at once
DEFAULT_ARTIFACTS_DIR = "/tmp/deepagents"  # where deepagents' offloaded files really live
# deepagents' offload directories under its default artifacts root "/" (its middleware's
# large_tool_results, conversation_history and blobs prefixes).
ARTIFACT_DIRS = ("/large_tool_results", "/conversation_history", "/blobs")

EMPTY_FILE_REMINDER = "System reminder: File exists but has empty contents"
EMPTY_OLD_STRING_ERROR = "Error: old_string cannot be empty. Provide the exact text to replace."
TRUNCATION_MSG = (
    "\n\n[Output was truncated due to size limits. "
    "This paginated read result exceeded the sandbox stdout limit. "
    "Continue reading with a larger offset or smaller limit to inspect the rest of the file.]"
)


def _file_error(exc: errors.TetherError) -> str:
    """deepagents' standard file error strings for the agent's error codes."""
    if isinstance(exc, errors.NotFound):
        return "file_not_found"
    if isinstance(exc, errors.PermissionDenied):
        return "permission_denied"
    if isinstance(exc, errors.IsADirectory):
        return "is_directory"
    if isinstance(exc, errors.InvalidPath):
        return "invalid_path"
    return str(exc)


def _iso(mtime_ms: int) -> str:
    return datetime.datetime.fromtimestamp(mtime_ms / 1000, datetime.timezone.utc).isoformat()


def _read_file_type(path: str) -> str:
    # deepagents decides text vs. binary by extension first (images, PDFs, video...).
    from deepagents.backends.utils import _get_backend_read_file_type

    return str(_get_backend_read_file_type(path))


class TetherSandbox(BaseSandbox):
    """A deepagents sandbox backend on a Tether sandbox.

    ``sandbox`` is a blocking :class:`~tether_sandbox.Sandbox` (``Sandbox.create(...)``,
    ``Sandbox.get_or_create(labels)``, ``Sandbox.connect(id)``); this backend does not delete
    it. ``timeout`` is the default command timeout in seconds, ``max_output_bytes`` the most
    combined output a command returns before ``truncated`` is set. ``artifacts_dir`` is the
    writable directory that holds deepagents' offloaded results and history (see the module's
    docstring); ``None`` leaves their paths as they are.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        timeout: int = DEFAULT_TIMEOUT_S,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
        artifacts_dir: str | None = DEFAULT_ARTIFACTS_DIR,
    ) -> None:
        if not isinstance(sandbox, Sandbox):
            raise TypeError(
                "TetherSandbox takes a tether_sandbox.Sandbox (the blocking one); "
                "its async twins run on the SDK's own loop"
            )
        self.sandbox = sandbox
        self._sb: AsyncSandbox = sandbox.async_sandbox
        self._timeout = timeout
        self._max_output = max_output_bytes
        self._artifacts = None if artifacts_dir is None else artifacts_dir.rstrip("/")

    @property
    def id(self) -> str:
        return self.sandbox.id

    def _real(self, path: str) -> str:
        """Where ``path`` is in the sandbox: deepagents' offload directories are under
        ``artifacts_dir``; every other path is itself. Results keep the caller's path."""
        if self._artifacts is None or not path.startswith("/"):
            return path
        norm = posixpath.normpath(path)
        for top in ARTIFACT_DIRS:
            if norm == top or norm.startswith(top + "/"):
                return self._artifacts + norm
        return path

    # --- sync and async entry points over one async implementation ------------------------

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_sync(coro)

    async def _async(self, coro: Coroutine[Any, Any, T]) -> T:
        return await run_async(coro)

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        return self._sync(self._execute(command, timeout))

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        return await self._async(self._execute(command, timeout))

    def ls(self, path: str) -> LsResult:
        return self._sync(self._ls(path))

    async def als(self, path: str) -> LsResult:
        return await self._async(self._ls(path))

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return self._sync(self._read(file_path, offset, limit))

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return await self._async(self._read(file_path, offset, limit))

    def write(self, file_path: str, content: str) -> WriteResult:
        return self._sync(self._write(file_path, content))

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        return await self._async(self._write(file_path, content))

    def edit(
        self, file_path: str, old_string: str, new_string: str, replace_all: bool = False
    ) -> EditResult:
        return self._sync(self._edit(file_path, old_string, new_string, replace_all))

    async def aedit(
        self, file_path: str, old_string: str, new_string: str, replace_all: bool = False
    ) -> EditResult:
        return await self._async(self._edit(file_path, old_string, new_string, replace_all))

    def delete(self, file_path: str) -> DeleteResult:
        return self._sync(self._delete(file_path))

    async def adelete(self, file_path: str) -> DeleteResult:
        return await self._async(self._delete(file_path))

    def grep(
        self,
        pattern: str,
        path: str | None = None,
        glob: str | None = None,
        *,
        max_count: int | None = None,
    ) -> GrepResult:
        return self._sync(self._grep(pattern, path, glob, max_count))

    async def agrep(
        self,
        pattern: str,
        path: str | None = None,
        glob: str | None = None,
        *,
        max_count: int | None = None,
    ) -> GrepResult:
        return await self._async(self._grep(pattern, path, glob, max_count))

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        return self._sync(self._glob(pattern, path))

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        return await self._async(self._glob(pattern, path))

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return self._sync(self._upload(files))

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return await self._async(self._upload(files))

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return self._sync(self._download(paths))

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return await self._async(self._download(paths))

    # --- the operations ---------------------------------------------------------------------

    async def _execute(self, command: str, timeout: int | None) -> ExecuteResponse:
        # deepagents: a timeout of 0 means none; None means the backend's default.
        limit = self._timeout if timeout is None else (timeout or None)
        result = await self._sb.commands.run(
            command, timeout=limit, output_limit=self._max_output, merge_stderr=True
        )
        return ExecuteResponse(
            output=result.output, exit_code=result.exit_code, truncated=result.truncated
        )

    async def _ls(self, path: str) -> LsResult:
        try:
            entries = await self._sb.files.list(self._real(path))
        except errors.NotFound:
            return LsResult(error=f"Path '{path}': path_not_found")
        except errors.NotADirectory:
            return LsResult(error=f"Path '{path}': not_a_directory")
        except errors.AgentError as exc:
            return LsResult(error=f"Path '{path}': {_file_error(exc)}")
        infos: list[FileInfo] = []
        for e in entries:
            infos.append(
                FileInfo(
                    path=posixpath.join(path, e.path),
                    is_dir=e.kind == "dir",
                    size=e.size,
                    modified_at=_iso(e.mtime_ms),
                )
            )
        return LsResult(entries=infos)

    async def _read(self, file_path: str, offset: int, limit: int) -> ReadResult:
        offset, limit = max(int(offset), 0), max(int(limit), 0)
        try:
            data = await self._sb.files.read(self._real(file_path), max_bytes=MAX_READ_BYTES)
        except errors.IsADirectory:
            return ReadResult(error=f"File '{file_path}': not_a_file")
        except errors.TooLarge:
            return ReadResult(
                error=f"File '{file_path}': over {MAX_READ_BYTES} bytes; read parts of it "
                "with execute (e.g. sed -n '1,100p')"
            )
        except errors.AgentError as exc:
            return ReadResult(error=f"File '{file_path}': {_file_error(exc)}")
        if not data:
            return ReadResult(file_data=_file_data(EMPTY_FILE_REMINDER, "utf-8"))
        if _read_file_type(file_path) != "text":
            if len(data) > MAX_BINARY_BYTES:
                return ReadResult(
                    error=f"File '{file_path}': Binary file exceeds maximum preview size of "
                    f"{MAX_BINARY_BYTES} bytes"
                )
            return _base64_result(data)
        try:
            codecs.getincrementaldecoder("utf-8")().decode(data[:8192], final=False)
        except UnicodeDecodeError:
            return _base64_result(data)
        if limit <= 0:
            return ReadResult(file_data=_file_data("", "utf-8"), no_lines_requested=True)
        return _page(data.decode("utf-8", "replace"), file_path, offset, limit)

    async def _write(self, file_path: str, content: str) -> WriteResult:
        try:
            await self._sb.files.write(self._real(file_path), content, create_parents=True)
        except errors.AgentError as exc:
            return WriteResult(error=f"Failed to write file '{file_path}': {_file_error(exc)}")
        return WriteResult(path=file_path)

    async def _edit(self, path: str, old: str, new: str, replace_all: bool) -> EditResult:
        if not old:
            return EditResult(error=EMPTY_OLD_STRING_ERROR)
        result = await self._edit_once(path, old, new, replace_all)
        if result.error == _STRING_NOT_FOUND and "\n" in old and "\r\n" not in old:
            # read() shows CRLF files with LF endings; edit them in the file's own style.
            crlf = await self._edit_once(
                path, old.replace("\n", "\r\n"), new.replace("\n", "\r\n"), replace_all
            )
            if crlf.error != _STRING_NOT_FOUND:
                return crlf if crlf.error is None else _edit_message(crlf.error, path, old)
        return result if result.error is None else _edit_message(result.error, path, old)

    async def _edit_once(self, path: str, old: str, new: str, replace_all: bool) -> EditResult:
        try:
            count = await self._sb.files.edit(self._real(path), old, new, replace_all=replace_all)
        except errors.NotFound:
            # The agent says not_found for a missing file and for missing text alike.
            exists = await self._sb.files.exists(self._real(path))
            return EditResult(error=_STRING_NOT_FOUND if exists else "file_not_found")
        except errors.InvalidArgument as exc:
            return EditResult(error="multiple_occurrences" if "occurs" in str(exc) else str(exc))
        except errors.IsADirectory:
            return EditResult(error="not_a_file")
        except errors.AgentError as exc:
            return EditResult(error=_file_error(exc))
        return EditResult(path=path, occurrences=count)

    async def _delete(self, file_path: str) -> DeleteResult:
        try:
            await self._sb.files.remove(self._real(file_path), recursive=True)
        except errors.NotFound:
            return DeleteResult(error=f"Error: '{file_path}' not found")
        except errors.AgentError as exc:
            return DeleteResult(error=f"Error deleting file '{file_path}': {_file_error(exc)}")
        return DeleteResult(path=file_path)

    async def _grep(
        self, pattern: str, path: str | None, glob: str | None, max_count: int | None
    ) -> GrepResult:
        root = path or "."
        # deepagents: a glob without '/' filters basenames at any depth.
        agent_glob = glob if glob is None or "/" in glob else f"**/{glob}"
        cap = MAX_GREP_MATCHES if max_count is None else max(int(max_count), 0) + 1
        try:
            found = await self._sb.files.grep(pattern, self._real(root), glob=agent_glob, limit=cap)
            info = await self._sb.files.stat(self._real(root))
        except errors.AgentError as exc:
            return GrepResult(error=f"Path '{root}': {_file_error(exc)}")
        matches: list[GrepMatch] = []
        skip = set(getattr(self, "grep_exclude_dirs", (".git",))) - {
            posixpath.basename(root.rstrip("/"))
        }
        for m in found.matches:
            if skip and skip.intersection(m.path.split("/")[:-1]):
                continue
            full = root if info.kind != "dir" else posixpath.join(root, m.path)
            matches.append(cast(GrepMatch, {"path": full, "line": m.line, "text": m.text}))
        if max_count is not None and len(matches) > max_count:
            return GrepResult(matches=matches[:max_count], truncated=True)
        return GrepResult(matches=matches, truncated=found.truncated and max_count is None)

    async def _glob(self, pattern: str, path: str | None) -> GlobResult:
        root = path if path and path.startswith("/") else f"/{path or ''}"
        patterns = _brace_expand(pattern)
        if patterns is None:
            return GlobResult(error=f"Pattern '{pattern}' expands past {MAX_BRACE_EXPANSIONS}")
        if any(".." in p.split("/") for p in patterns):
            return GlobResult(error=f"Pattern '{pattern}': '..' segments are not allowed")
        found: dict[str, None] = {}
        truncated = False
        for p in patterns:
            if p.startswith("/"):
                agent_pattern = p.lstrip("/")
            elif "/" in p:
                agent_pattern = p
            else:
                agent_pattern = f"**/{p}"
            try:
                res = await self._sb.files.glob(
                    agent_pattern, root=self._real(root), limit=MAX_GLOB_MATCHES
                )
            except errors.AgentError as exc:
                return GlobResult(error=f"Path '{root}': {_file_error(exc)}")
            truncated = truncated or res.truncated
            last = p.rsplit("/", 1)[-1]
            for rel in res.paths:
                # deepagents: names starting with '.' match only a pattern that starts with '.'.
                if posixpath.basename(rel).startswith(".") and not last.startswith("."):
                    continue
                found[rel] = None
        infos = await self._stat_all(self._real(root), list(found)[:MAX_GLOB_MATCHES])
        matches = [
            cast(FileInfo, {"path": posixpath.join(root, rel), "is_dir": False, "size": i.size})
            for rel, i in infos
            if i.kind == "file"
        ]
        truncated = truncated or len(found) > MAX_GLOB_MATCHES
        result = GlobResult(matches=matches, truncated=truncated)
        if truncated and hasattr(result, "truncation_reason"):  # deepagents 0.7.2x and later
            result.truncation_reason = "budget"
        return result

    async def _stat_all(self, root: str, rels: list[str]) -> list[tuple[str, TetherFileInfo]]:
        # Glob returns files, directories and links alike; deepagents wants regular files.
        gate = asyncio.Semaphore(STAT_CONCURRENCY)

        async def one(rel: str) -> tuple[str, TetherFileInfo] | None:
            async with gate:
                try:
                    return rel, await self._sb.files.stat(posixpath.join(root, rel))
                except errors.AgentError:
                    return None

        done = await asyncio.gather(*(one(r) for r in rels))
        return [d for d in done if d is not None]

    async def _upload(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        # deepagents' paths are absolute; a relative one would land wherever the sandbox's
        # working directory is, so it is refused as `invalid_path` (as deepagents' own
        # backends do) and only the absolute ones travel, in one batch.
        sent = [(p, data) for p, data in files if p.startswith("/")]
        results = iter(
            await self._sb.files.write_batch([(self._real(p), d) for p, d in sent]) if sent else []
        )
        # One result per file, in order: each answers for the path the caller gave.
        out: list[FileUploadResponse] = []
        for path, _ in files:
            if not path.startswith("/"):
                out.append(FileUploadResponse(path, "invalid_path"))
                continue
            r = next(results)
            out.append(FileUploadResponse(path, None if r.error is None else _file_error(r.error)))
        return out

    async def _download(self, paths: list[str]) -> list[FileDownloadResponse]:
        # Relative paths are refused as in _upload.
        sent = [p for p in paths if p.startswith("/")]
        results = iter(
            await self._sb.files.read_batch([self._real(p) for p in sent]) if sent else []
        )
        out: list[FileDownloadResponse] = []
        for path in paths:
            if not path.startswith("/"):
                out.append(FileDownloadResponse(path, None, "invalid_path"))
                continue
            r = next(results)
            err = None if r.error is None else _file_error(r.error)
            out.append(FileDownloadResponse(path, r.data, err))
        return out


_STRING_NOT_FOUND = "string_not_found"


def _edit_message(code: str, path: str, old: str) -> EditResult:
    messages = {
        "file_not_found": f"Error: File '{path}' not found",
        "permission_denied": f"Error: Permission denied editing file '{path}'",
        "not_a_file": f"Error: '{path}' is not a regular file",
        _STRING_NOT_FOUND: f"Error: String not found in file: '{old}'",
        "multiple_occurrences": (
            f"Error: String '{old}' appears multiple times. "
            "Use replace_all=True to replace all occurrences."
        ),
    }
    return EditResult(error=messages.get(code, f"Error editing file '{path}': {code}"))


def _file_data(content: str, encoding: str) -> FileData:
    # Older deepagents declare the timestamps required; they are optional in practice.
    return cast(FileData, {"content": content, "encoding": encoding})


def _base64_result(data: bytes) -> ReadResult:
    content = base64.b64encode(data).decode("ascii")
    return ReadResult(file_data=_file_data(content, "base64"))


_NEWLINES = re.compile(r"\r\n|\r|\n")


def _page(text: str, path: str, offset: int, limit: int) -> ReadResult:
    """One page of lines, as deepagents' read script cuts it (universal newlines, a byte cap
    with its truncation notice, 1-based start/end lines and the next 0-based offset)."""
    lines = _NEWLINES.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    total = len(lines)
    if offset >= total:
        return ReadResult(
            error=f"File '{path}': Line offset {offset} exceeds file length ({total} lines)"
        )
    budget = MAX_PAGE_BYTES - len(TRUNCATION_MSG.encode())
    parts: list[str] = []
    used, returned, truncated = 0, 0, False
    for line in lines[offset : offset + limit]:
        piece = line if returned == 0 else "\n" + line
        size = len(piece.encode())
        if used + size > budget:
            truncated = True
            prefix = piece.encode()[: budget - used].decode("utf-8", "ignore")
            parts.append(prefix)
            break
        parts.append(piece)
        used += size
        returned += 1
    content = "".join(parts) + (TRUNCATION_MSG if truncated else "")
    returned = max(returned, 1)
    end = offset + returned
    return ReadResult(
        file_data=_file_data(content, "utf-8"),
        total_lines=total,
        start_line=offset + 1,
        end_line=end,
        next_offset=end if end < total else None,
    )


def _brace_expand(pattern: str) -> list[str] | None:
    """``{a,b}`` alternatives expanded (nested too), as deepagents' glob does; None past
    :data:`MAX_BRACE_EXPANSIONS`."""
    out: list[str] = []
    todo = [pattern]
    while todo:
        p = todo.pop()
        start = p.find("{")
        end, depth = -1, 0
        for i in range(start, len(p)) if start >= 0 else ():
            depth += {"{": 1, "}": -1}.get(p[i], 0)
            if depth == 0:
                end = i
                break
        if start < 0 or end < 0:
            out.append(p)
        else:
            body, alts, depth, last = p[start + 1 : end], [], 0, 0
            for i, c in enumerate(body):
                depth += {"{": 1, "}": -1}.get(c, 0)
                if c == "," and depth == 0:
                    alts.append(body[last:i])
                    last = i + 1
            alts.append(body[last:])
            if len(alts) == 1:
                out.append(p)  # a lone {x} is literal
            else:
                todo.extend(p[:start] + a + p[end + 1 :] for a in alts)
        if len(out) + len(todo) > MAX_BRACE_EXPANSIONS:
            return None
    return sorted(set(out))
