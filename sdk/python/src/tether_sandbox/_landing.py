"""How bytes from a sandbox land on this machine: the one discipline every host-side write of
the SDK goes through (``files.download_file``, ``files.download_dir``, the integrations).

The sandbox is hostile, and what it sent before (through ``download_dir``, ``tether sync``
pulls or ``tether cp``, which keep links as links) may already stand where we write. So:

- **Names** from the sandbox are checked component by component (:func:`entry_parts`): no
  absolute name, no ``..``, no NUL, no component over 255 bytes, no name over 4095 bytes.
- **Directories** below a destination are reached from the destination's own fd, one
  component at a time, with ``O_NOFOLLOW | O_DIRECTORY`` (:class:`Dest`): a symlink on the
  way is refused, never followed. The destination itself is the caller's choice and may be
  reached through links of the caller's own.
- **Files** are written under a fresh random name created with ``O_CREAT | O_EXCL |
  O_NOFOLLOW`` and mode 0o600 in their final directory (:class:`Landing`), so nothing planted
  at any name is ever opened; complete, they get their mode through that fd and are renamed
  into place relative to the directory fd. ``rename`` replaces a symlink standing at the
  final name instead of following it. A file that never completes (an error, a cut, Ctrl-C)
  is removed: the old file, or none, stays.
- **Symlinks** are made after every file and directory (:meth:`Dest.symlinks`), each only if
  its target, resolved against the tree as it stands on disk (following the links already
  there, as the kernel would, not lexically), stays inside the destination. Once all are
  made each is resolved again, since a later link can change where an earlier one leads;
  one that now leads out is removed (it is ours: just made, and still the same link) and
  the download fails.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Sequence
from types import TracebackType
from typing import IO

from ._constants import (
    LANDING_ATTEMPTS,
    LANDING_COPY,
    LANDING_PREFIX,
    LANDING_RANDOM_HEX,
    MAX_LINK_HOPS,
    MAX_NAME_BYTES,
    MAX_PATH_BYTES,
)
from .errors import ProtocolError

Parts = tuple[str, ...]

# Flags of every directory opened below a destination.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Flags of a temporary file: made here and now, never something already there.
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# Mode of a temporary file until it is complete: no one else reads a partial file.
_TEMP_MODE = 0o600
# Mode of a directory made on the way to a file (the umask applies).
_NEW_DIR_MODE = 0o755


def _bytes(name: str) -> bytes:
    return os.fsencode(name)


def entry_parts(name: str) -> Parts:
    """The components of ``name``, a path relative to a destination as the sandbox sent it;
    raises :class:`ProtocolError` for one that could leave the destination or that no file
    system takes. ``.`` and empty components are dropped (``./a//b`` is ``a/b``)."""
    shown = f"{name!r:.200}"
    if "\x00" in name:
        raise ProtocolError(f"the sandbox sent a name with a NUL byte: {shown}")
    if name.startswith("/"):
        raise ProtocolError(f"the sandbox sent an absolute name: {shown}; refused")
    if len(_bytes(name)) > MAX_PATH_BYTES:
        raise ProtocolError(f"the sandbox sent a name over {MAX_PATH_BYTES} bytes: {shown}")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    for part in parts:
        if part == "..":
            raise ProtocolError(f"the sandbox sent a name with `..`: {shown}; refused")
        if len(_bytes(part)) > MAX_NAME_BYTES:
            raise ProtocolError(
                f"the sandbox sent a name with a component over {MAX_NAME_BYTES} bytes: {shown}"
            )
    return parts


def _temp_name() -> str:
    return LANDING_PREFIX + secrets.token_hex(LANDING_RANDOM_HEX // 2)


class Landing:
    """A file being written under a temporary name in the directory ``dir_fd`` (borrowed, not
    closed here); :meth:`land` renames it into place, and leaving the ``with`` block without
    landing removes it."""

    def __init__(self, dir_fd: int, shown: str) -> None:
        self._dir = dir_fd
        self.shown = shown
        last: OSError | None = None
        for _ in range(LANDING_ATTEMPTS):
            tmp = _temp_name()
            try:
                fd = os.open(tmp, _TEMP_FLAGS, _TEMP_MODE, dir_fd=dir_fd)
            except FileExistsError as exc:
                last = exc
                continue
            self._tmp: str | None = tmp
            self.file: IO[bytes] = os.fdopen(fd, "wb")
            return
        raise OSError(
            errno.EEXIST, f"could not make a temporary file beside {shown}: every name was taken"
        ) from last

    def __enter__(self) -> Landing:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.discard()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.file.write(data)

    def copy_from(self, source: IO[bytes]) -> None:
        while chunk := source.read(LANDING_COPY):
            self.file.write(chunk)

    def land(self, name: str, mode: int) -> None:
        """Gives the file ``mode`` (permission bits only: never setuid) and renames it to
        ``name`` in its directory, replacing a file or symlink there (a directory there is an
        error)."""
        if self._tmp is None:
            raise RuntimeError("this file has already landed or been discarded")
        self.file.flush()
        os.fchmod(self.file.fileno(), mode & 0o777)
        self.file.close()
        try:
            os.rename(self._tmp, name, src_dir_fd=self._dir, dst_dir_fd=self._dir)
        except IsADirectoryError:
            raise IsADirectoryError(
                errno.EISDIR, f"{self.shown} is a directory; remove it or choose another name"
            ) from None
        self._tmp = None

    def discard(self) -> None:
        """Removes the file unless it landed."""
        if self._tmp is None:
            return
        self.file.close()
        try:
            os.unlink(self._tmp, dir_fd=self._dir)
        except FileNotFoundError:
            pass
        self._tmp = None


def land_file(local: str | os.PathLike[str], mode: int) -> _HostFile:
    """A :class:`Landing` for the host path ``local``, the caller's own choice: its directory
    may be reached through the caller's links, but a symlink at ``local`` itself is replaced,
    never written through. Use it as ``with land_file(p, 0o644) as f: f.write(...); f.land()``."""
    path = os.fspath(local)
    parent, name = os.path.split(path)
    if name in ("", ".", ".."):
        raise IsADirectoryError(errno.EISDIR, f"{path} names no file; give the file's path")
    dir_fd = os.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _HostFile(dir_fd, name, mode, path)
    except BaseException:
        os.close(dir_fd)
        raise


class _HostFile(Landing):
    """A :class:`Landing` that owns its directory fd and knows its final name."""

    def __init__(self, dir_fd: int, name: str, mode: int, shown: str) -> None:
        super().__init__(dir_fd, shown)
        self._name, self._mode = name, mode

    def __enter__(self) -> _HostFile:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.discard()
        finally:
            os.close(self._dir)

    def land_here(self) -> None:
        """Lands the file at the host path it was made for."""
        self.land(self._name, self._mode)


def write_host_file(local: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Writes ``data`` to the host path ``local`` through a :class:`Landing`."""
    with land_file(local, mode) as out:
        out.write(data)
        out.land_here()


class Dest:
    """A destination directory, opened once by fd; everything below it is reached from that
    fd without following links. Close it (or use ``with``) when done."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool) -> None:
        self.path = os.fspath(path)
        if create:
            os.makedirs(self.path, exist_ok=True)
        self._root = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._links: list[tuple[Parts, str]] = []

    def __enter__(self) -> Dest:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        os.close(self._root)

    def shown(self, parts: Sequence[str]) -> str:
        return os.path.join(self.path, *parts)

    def _walk(self, parts: Sequence[str], *, create: bool) -> int:
        """An fd of the directory ``parts`` below the destination (the caller closes it)."""
        fd = os.dup(self._root)
        try:
            for depth, part in enumerate(parts):
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, _NEW_DIR_MODE, dir_fd=fd)
                    except FileExistsError:
                        pass
                    child = self._open_dir(part, fd, parts[: depth + 1])
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise self._not_a_dir(parts[: depth + 1]) from None
                    raise
                os.close(fd)
                fd = child
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _open_dir(self, part: str, fd: int, here: Sequence[str]) -> int:
        try:
            return os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._not_a_dir(here) from None
            raise

    def _not_a_dir(self, parts: Sequence[str]) -> ProtocolError:
        return ProtocolError(
            f"{self.shown(parts)} is a symlink or a file, not a directory; nothing is written "
            "through it (remove it to download here)"
        )

    def mkdir(self, parts: Parts, mode: int) -> None:
        """The directory ``parts``, made with what is above it; given ``mode`` (and always
        0o700, so what goes in it can be written)."""
        if not parts:
            return  # the destination itself is the caller's, and keeps its mode
        fd = self._walk(parts, create=True)
        try:
            os.fchmod(fd, (mode & 0o777) | 0o700)
        finally:
            os.close(fd)

    def write_file(self, parts: Parts, source: IO[bytes], mode: int) -> None:
        """The file ``parts`` with the bytes of ``source``, landed whole or not at all."""
        if not parts:
            raise ProtocolError("the sandbox sent a file with no name")
        fd = self._walk(parts[:-1], create=True)
        try:
            with Landing(fd, self.shown(parts)) as out:
                out.copy_from(source)
                out.land(parts[-1], mode)
        finally:
            os.close(fd)

    def add_symlink(self, parts: Parts, target: str) -> None:
        """Records the symlink ``parts -> target``, made by :meth:`symlinks` once every file
        and directory is in place; refuses at once a target no resolution could keep inside."""
        shown = f"{'/'.join(parts)} -> {target!r:.200}"
        if not parts:
            raise ProtocolError("the sandbox sent a symlink with no name")
        if not target or "\x00" in target or len(_bytes(target)) > MAX_PATH_BYTES:
            raise ProtocolError(f"the sandbox sent a symlink with an invalid target: {shown}")
        if target.startswith("/"):
            raise ProtocolError(f"the archive's symlink {shown} points outside its directory")
        self._links.append((parts, target))

    def symlinks(self) -> list[str]:
        """Makes the recorded symlinks, each checked against the tree as it stands; returns
        their names."""
        made: list[tuple[Parts, str]] = []
        for parts, target in self._links:
            if self.resolve(parts[:-1], target) is None:
                raise ProtocolError(
                    f"the archive's symlink {'/'.join(parts)} -> {target!r:.200} leads "
                    "outside its directory"
                )
            self._make_link(parts, target)
            made.append((parts, target))
        # A later link may have changed where an earlier one leads: check them all again.
        escaping = [(p, t) for p, t in made if self.resolve(p[:-1], t) is None]
        for parts, target in escaping:
            self._remove_own_link(parts, target)
        if escaping:
            parts, target = escaping[0]
            raise ProtocolError(
                f"the archive's symlink {'/'.join(parts)} -> {target!r:.200} leads outside its "
                "directory through the links after it; removed"
            )
        return ["/".join(p) for p, _ in made]

    def _make_link(self, parts: Parts, target: str) -> None:
        fd = self._walk(parts[:-1], create=True)
        try:
            for _ in range(LANDING_ATTEMPTS):
                tmp = _temp_name()
                try:
                    os.symlink(target, tmp, dir_fd=fd)
                    break
                except FileExistsError:
                    continue
            else:
                raise OSError(errno.EEXIST, f"no free temporary name beside {self.shown(parts)}")
            try:
                os.rename(tmp, parts[-1], src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                os.unlink(tmp, dir_fd=fd)
                raise
        finally:
            os.close(fd)

    def _remove_own_link(self, parts: Parts, target: str) -> None:
        """Removes the link at ``parts`` if it is still the one made here."""
        try:
            fd = self._walk(parts[:-1], create=False)
        except (OSError, ProtocolError):
            return
        try:
            if os.readlink(parts[-1], dir_fd=fd) == target:
                os.unlink(parts[-1], dir_fd=fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _lstat_link(self, parts: Parts) -> str | None:
        """The target of ``parts`` if it is a symlink now; ``None`` if it is anything else or
        nothing (or cannot be reached without following a link)."""
        try:
            fd = self._walk(parts[:-1], create=False)
        except (OSError, ProtocolError):
            return None
        try:
            return os.readlink(parts[-1], dir_fd=fd)
        except OSError:
            return None
        finally:
            os.close(fd)

    def resolve(self, base: Parts, target: str) -> Parts | None:
        """Where the link target ``target``, in the directory ``base``, leads: components
        below the destination, resolved against the tree on disk now (links in the way are
        followed, as the kernel would, at most ``MAX_LINK_HOPS``); ``None`` if it leaves the
        destination, is absolute or loops."""
        stack = list(base)
        pending = list(reversed(target.split("/")))
        if target.startswith("/"):
            return None
        hops = 0
        while pending:
            part = pending.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if not stack:
                    return None
                stack.pop()
                continue
            stack.append(part)
            inner = self._lstat_link(tuple(stack))
            if inner is None:
                continue
            hops += 1
            if hops > MAX_LINK_HOPS or inner.startswith("/"):
                return None
            stack.pop()
            pending.extend(reversed(inner.split("/")))
        return tuple(stack)
