"""Files in the sandbox: read and write (bytes and text), metadata, listings, search, edits,
batches with per-file errors, directories as tar archives, and watches.

Sizes the sandbox reports are checked against what arrives and capped: a hostile sandbox
cannot make the host buffer more than the caller allowed. Every host file written here
(``download_file``, ``download_dir``) lands through :mod:`._landing`.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ._constants import BULK_WINDOW, DEFAULT_MAX_DOWNLOAD, DEFAULT_MAX_READ
from ._landing import land_file
from ._protocol import Data, Message, Stream, expect_reply, raise_if_error
from ._tar import pack_directory, safe_extract
from .errors import ConnectionLost, NotFound, ProtocolError, TooLarge, agent_error
from .types import (
    FileEvent,
    FileInfo,
    GlobResult,
    GrepMatch,
    GrepResult,
    ReadResult,
    WriteResult,
)

if TYPE_CHECKING:
    from ._sandbox import AsyncSandbox

IfExists = Literal["overwrite", "fail", "append"]


async def _read_download(stream: Stream, limit: int, what: str) -> bytearray:
    """Collects a download's bytes until ``eof`` on ``out``; fails past ``limit`` bytes."""
    buf = bytearray()
    complete = False
    while (item := await stream.recv()) is not None:
        if isinstance(item, Data):
            if len(buf) + len(item.data) > limit:
                await stream.cancel()
                raise TooLarge(f"{what} is over the {limit}-byte limit; raise max_bytes to read it")
            buf += item.data
            continue
        raise_if_error(item)
        if item.get("type") == "eof":
            complete = True
    if not complete:
        raise ProtocolError(f"the download of {what} ended without its eof")
    return buf


class AsyncWatch:
    """Changes under a watched directory: iterate for :class:`FileEvent`, :meth:`close` to
    stop."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream

    def __aiter__(self) -> AsyncIterator[FileEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[FileEvent]:
        while True:
            event = await self.next()
            if event is None:
                return
            yield event

    async def next(self) -> FileEvent | None:
        """The next change, or ``None`` once the watch has ended."""
        while (item := await self._stream.recv()) is not None:
            if isinstance(item, Data):
                raise ProtocolError("unexpected data on a watch stream")
            raise_if_error(item)
            if item.get("type") != "event":
                continue
            kind = item.get("kind")
            if kind == "rename":
                return FileEvent("rename", _str(item.get("to")), _str(item.get("from")))
            if kind in ("create", "modify", "remove"):
                return FileEvent(kind, _str(item.get("path")), None, bool(item.get("dir")))
            if kind == "overflow":
                return FileEvent("overflow", None)
            raise ProtocolError(f"unknown watch event kind {kind!r:.40}")
        return None

    async def close(self) -> None:
        """Stops watching."""
        await self._stream.cancel()
        try:
            while await self._stream.recv() is not None:
                pass
        except ConnectionLost:
            pass


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ProtocolError("the sandbox sent a path that is not a string")
    return value


class AsyncFiles:
    """``sandbox.files``: the sandbox's file system. Relative paths are relative to the
    agent's working directory."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def _request(self, op: str, fields: Message, reply: str) -> Message:
        return await expect_reply(await self._sandbox._open(op, fields), reply)

    # --- whole files ----------------------------------------------------------------------

    async def read(
        self,
        path: str,
        *,
        offset: int = 0,
        length: int | None = None,
        max_bytes: int = DEFAULT_MAX_READ,
    ) -> bytes:
        """The file's bytes (or ``length`` bytes from ``offset``). Fails with
        :class:`TooLarge` past ``max_bytes``."""
        fields: Message = {"path": path}
        if offset:
            fields["offset"] = offset
        if length is not None:
            fields["len"] = length
        stream = await self._sandbox._open("read", fields, window=BULK_WINDOW)
        first = await stream.recv()
        if first is None or isinstance(first, Data):
            raise ProtocolError("a read stream did not start with its stat reply")
        raise_if_error(first)
        size = FileInfo.from_json(first).size
        if min(max(size - offset, 0), length if length is not None else size) > max_bytes:
            await stream.cancel()
            raise TooLarge(
                f"{path} is {size} bytes, over max_bytes={max_bytes}; raise it to read the file"
            )
        return bytes(await _read_download(stream, max_bytes, path))

    async def read_text(self, path: str, *, encoding: str = "utf-8", errors: str = "strict") -> str:
        """The file decoded as text."""
        return (await self.read(path)).decode(encoding, errors)

    async def write(
        self,
        path: str,
        data: bytes | str,
        *,
        mode: int | None = None,
        create_parents: bool = True,
        if_exists: IfExists = "overwrite",
    ) -> int:
        """Writes the file atomically (readers see the old or the new content, never a mix),
        creating parent directories; returns the bytes written. ``if_exists="append"`` appends,
        ``"fail"`` raises :class:`AlreadyExists`."""
        payload = data.encode() if isinstance(data, str) else data
        fields: Message = {"path": path, "create_parents": create_parents, "if_exists": if_exists}
        if mode is not None:
            fields["mode"] = mode
        stream = await self._sandbox._open("write", fields)
        await stream.send(payload)
        await stream.eof()
        reply = await expect_reply(stream, "written")
        written = reply.get("bytes")
        return written if isinstance(written, int) else len(payload)

    async def upload_file(
        self, local: str | os.PathLike[str], path: str, *, mode: int | None = None
    ) -> int:
        """Streams a host file to ``path`` in the sandbox (constant memory)."""
        fields: Message = {"path": path, "create_parents": True}
        fields["mode"] = mode if mode is not None else os.stat(local).st_mode & 0o7777
        stream = await self._sandbox._open("write", fields)
        with open(local, "rb") as f:
            while chunk := f.read(1 << 20):
                await stream.send(chunk)
        await stream.eof()
        reply = await expect_reply(stream, "written")
        return int(reply.get("bytes") or 0)

    async def download_file(
        self, path: str, local: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_DOWNLOAD
    ) -> int:
        """Streams ``path`` from the sandbox to a host file (constant memory); returns its size.
        The file lands whole or not at all, with the sandbox's permission bits (never setuid);
        a symlink at ``local`` is replaced, not written through."""
        stream = await self._sandbox._open("read", {"path": path}, window=BULK_WINDOW)
        first = await stream.recv()
        if first is None or isinstance(first, Data):
            raise ProtocolError("a read stream did not start with its stat reply")
        raise_if_error(first)
        mode = FileInfo.from_json(first).mode
        total, complete = 0, False
        # Through _landing: a fresh random temporary name beside `local`, renamed over it
        # (replacing, never following, a symlink there); removed if the download fails.
        with land_file(local, mode) as out:
            while (item := await stream.recv()) is not None:
                if isinstance(item, Data):
                    total += len(item.data)
                    if total > max_bytes:
                        await stream.cancel()
                        raise TooLarge(f"{path} is over max_bytes={max_bytes}")
                    out.write(item.data)
                    continue
                raise_if_error(item)
                complete = complete or item.get("type") == "eof"
            if not complete:
                raise ProtocolError(f"the download of {path} ended without its eof")
            out.land_here()
        return total

    # --- metadata and directories -----------------------------------------------------------

    async def stat(self, path: str) -> FileInfo:
        """The path's metadata; symlinks are not followed."""
        return FileInfo.from_json(await self._request("stat", {"path": path}, "stat"))

    async def exists(self, path: str) -> bool:
        """Whether the path exists (a dangling symlink counts)."""
        try:
            await self.stat(path)
        except NotFound:
            return False
        return True

    async def list(self, path: str = ".", *, depth: int = 1) -> list[FileInfo]:
        """The directory's entries (``depth`` levels down), paths relative to it."""
        reply = await self._request("list", {"path": path, "depth": depth}, "entries")
        entries = reply.get("entries")
        if not isinstance(entries, list):
            raise ProtocolError("the entries reply lacks its list")
        return [FileInfo.from_json(e) for e in entries]

    async def mkdir(self, path: str, *, mode: int | None = None) -> None:
        """Creates the directory and its parents (like ``mkdir -p``)."""
        fields: Message = {"path": path}
        if mode is not None:
            fields["mode"] = mode
        await self._request("mkdir", fields, "ok")

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, a symlink, or a directory (non-empty ones with ``recursive``)."""
        await self._request("remove", {"path": path, "recursive": recursive}, "ok")

    async def rename(self, src: str, dst: str, *, overwrite: bool = False) -> None:
        """Renames (moves) ``src`` to ``dst``."""
        await self._request("rename", {"from": src, "to": dst, "overwrite": overwrite}, "ok")

    async def chmod(self, path: str, mode: int) -> None:
        """Sets permission bits, e.g. ``0o755``."""
        await self._request("chmod", {"path": path, "mode": mode}, "ok")

    # --- search and edit -------------------------------------------------------------------

    async def glob(self, pattern: str, *, root: str = ".", limit: int | None = None) -> GlobResult:
        """Paths under ``root`` matching ``pattern`` (``*``, ``?``, ``[a-z]``, ``**``)."""
        fields: Message = {"root": root, "pattern": pattern}
        if limit is not None:
            fields["limit"] = limit
        reply = await self._request("glob", fields, "paths")
        paths = reply.get("paths")
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise ProtocolError("the paths reply lacks its list of strings")
        return GlobResult(paths, bool(reply.get("truncated")))

    async def grep(
        self,
        pattern: str,
        path: str = ".",
        *,
        regex: bool = False,
        ignore_case: bool = False,
        glob: str | None = None,
        limit: int | None = None,
    ) -> GrepResult:
        """Lines matching ``pattern`` (a literal, or a regular expression with ``regex``) in a
        file or, recursively, a directory; binary files are skipped."""
        fields: Message = {
            "path": path,
            "pattern": pattern,
            "regex": regex,
            "ignore_case": ignore_case,
        }
        if glob is not None:
            fields["glob"] = glob
        if limit is not None:
            fields["limit"] = limit
        reply = await self._request("grep", fields, "matches")
        raw = reply.get("matches")
        if not isinstance(raw, list):
            raise ProtocolError("the matches reply lacks its list")
        matches = []
        for m in raw:
            if not isinstance(m, dict) or not isinstance(m.get("line"), int):
                raise ProtocolError("a grep match is malformed")
            matches.append(GrepMatch(_str(m.get("path")), int(m["line"]), _str(m.get("text"))))
        return GrepResult(matches, bool(reply.get("truncated")))

    async def edit(self, path: str, old: str, new: str, *, replace_all: bool = False) -> int:
        """Replaces ``old`` with ``new`` in a text file, atomically; returns the number of
        replacements. Without ``replace_all``, ``old`` must occur exactly once."""
        reply = await self._request(
            "edit", {"path": path, "old": old, "new": new, "replace_all": replace_all}, "edited"
        )
        count = reply.get("replacements")
        if not isinstance(count, int):
            raise ProtocolError("the edited reply lacks its count")
        return count

    # --- batches ---------------------------------------------------------------------------

    async def write_batch(
        self, files: Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]]
    ) -> builtins.list[WriteResult]:
        """Writes many files in one upload; one file failing does not stop the others. Returns
        one result per file, in order, each with its ``size`` or its ``error``."""
        items = list(files.items()) if isinstance(files, Mapping) else list(files)
        blobs = [(p, d.encode() if isinstance(d, str) else d) for p, d in items]
        stream = await self._sandbox._open(
            "write_batch", {"files": [{"path": p, "size": len(d)} for p, d in blobs]}
        )
        for _, data in blobs:
            await stream.send(data)
        await stream.eof()
        reply = await expect_reply(stream, "batch")
        results = _batch_results(reply, [p for p, _ in blobs])
        return [WriteResult(path, size, error) for path, size, error in results]

    async def read_batch(
        self, paths: Sequence[str], *, max_bytes: int = DEFAULT_MAX_READ
    ) -> builtins.list[ReadResult]:
        """Reads many files in one download; a missing or unreadable file gets its own
        ``error`` and the others are read. ``max_bytes`` caps the total."""
        paths = list(paths)
        stream = await self._sandbox._open("read_batch", {"paths": paths}, window=BULK_WINDOW)
        first = await stream.recv()
        if first is None or isinstance(first, Data):
            raise ProtocolError("a read_batch stream did not start with its reply")
        raise_if_error(first)
        results = _batch_results(first, paths)
        total = sum(size or 0 for _, size, _ in results)
        if total > max_bytes:
            await stream.cancel()
            raise TooLarge(f"the files add up to {total} bytes, over max_bytes={max_bytes}")
        data = await _read_download(stream, total, "the batch")
        if len(data) != total:
            raise ProtocolError(f"the batch announced {total} bytes and sent {len(data)}")
        out, pos = [], 0
        for path, size, error in results:
            if size is None:
                out.append(ReadResult(path, None, error))
            else:
                out.append(ReadResult(path, bytes(data[pos : pos + size]), None))
                pos += size
        return out

    # --- directories as tar ----------------------------------------------------------------

    async def read_tar(
        self, path: str, *, exclude: Sequence[str] = (), max_bytes: int = DEFAULT_MAX_DOWNLOAD
    ) -> bytes:
        """``path`` (a directory or file) as an uncompressed tar archive."""
        stream = await self._sandbox._open(
            "tar_read", {"path": path, "exclude": list(exclude)}, window=BULK_WINDOW
        )
        return bytes(await _read_download(stream, max_bytes, path))

    async def write_tar(self, path: str, archive: bytes, *, gzip: bool = False) -> None:
        """Unpacks a tar (or, with ``gzip``, tar.gz) archive into the directory ``path``."""
        stream = await self._sandbox._open("tar_write", {"path": path, "gzip": gzip})
        await stream.send(archive)
        await stream.eof()
        await expect_reply(stream, "ok")

    async def upload_dir(self, local: str | os.PathLike[str], path: str) -> None:
        """Copies a host directory's contents into ``path`` in the sandbox."""
        await self.write_tar(path, pack_directory(Path(local)))

    async def download_dir(
        self,
        path: str,
        local: str | os.PathLike[str],
        *,
        exclude: Sequence[str] = (),
        max_bytes: int = DEFAULT_MAX_DOWNLOAD,
    ) -> builtins.list[str]:
        """Copies the sandbox directory ``path`` into the host directory ``local``; returns the
        paths written. Entries that would land outside ``local`` (absolute, ``..``, links out,
        devices) are refused."""
        archive = await self.read_tar(path, exclude=exclude, max_bytes=max_bytes)
        return safe_extract(archive, Path(local), max_bytes=max_bytes)

    # --- watch -----------------------------------------------------------------------------

    async def watch(self, path: str, *, recursive: bool = True) -> AsyncWatch:
        """Starts watching ``path``; changes made after this returns are reported."""
        stream = await self._sandbox._open("watch", {"path": path, "recursive": recursive})
        first = await stream.recv()
        if first is None or isinstance(first, Data):
            raise ProtocolError("a watch stream did not start with its reply")
        raise_if_error(first)
        if first.get("type") != "reply" or first.get("reply") != "ok":
            raise ProtocolError(f"expected the watch's ok, got {first!r:.200}")
        return AsyncWatch(stream)


def _batch_results(reply: Message, paths: Sequence[str]) -> list[tuple[str, int | None, Any]]:
    if reply.get("type") != "reply" or reply.get("reply") != "batch":
        raise ProtocolError("expected a batch reply")
    raw = reply.get("results")
    if not isinstance(raw, list) or len(raw) != len(paths):
        raise ProtocolError("the batch reply does not have one result per file")
    results: list[tuple[str, int | None, Any]] = []
    for path, r in zip(paths, raw, strict=True):
        if not isinstance(r, dict):
            raise ProtocolError("a batch result is not an object")
        size = r.get("size")
        if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
            results.append((path, size, None))
        else:
            results.append(
                (
                    path,
                    None,
                    agent_error(
                        str(r.get("error") or "internal"), str(r.get("message") or "failed")
                    ),
                )
            )
    return results
