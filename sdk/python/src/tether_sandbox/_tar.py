"""Tar archives on the host side: packing a host directory for upload, and unpacking an
archive the sandbox sent without letting it write outside its destination.

The archive comes from a hostile sandbox, so extraction is by hand, entry by entry: regular
files and directories only (symlinks are kept only when they point inside the destination,
hard links and devices are refused), every name resolved and checked to stay under the
destination, sizes capped, and no permission bits beyond 0o777 (no setuid).
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import IO

from ._constants import MAX_TAR_ENTRIES
from .errors import ProtocolError, TooLarge


def pack_directory(root: Path) -> bytes:
    """The contents of the host directory ``root`` as an uncompressed tar archive."""
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(root.iterdir()):
            tar.add(entry, arcname=entry.name, recursive=True)
    return buf.getvalue()


def _inside(dest: Path, name: str) -> Path:
    """Where entry ``name`` goes under ``dest``; raises if it would leave it."""
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or "\x00" in name:
        raise ProtocolError(f"the archive holds an entry outside its directory: {name!r:.200}")
    parts = [p for p in pure.parts if p not in ("", ".")]
    target = dest.joinpath(*parts) if parts else dest
    # A symlink written earlier must not carry later entries elsewhere.
    parent = target.parent.resolve()
    if parent != dest and dest not in parent.parents:
        raise ProtocolError(
            f"the archive's entry {name!r:.200} goes through a link out of its directory"
        )
    return target


def _write_atomically(target: Path, source: IO[bytes], mode: int) -> None:
    """Writes ``source`` to ``target`` through a temporary file beside it, renamed over it
    when complete: an interrupted download (an error, Ctrl-C) leaves no partial file, and
    the temporary is removed."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tether-part-")
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(1 << 20):
                out.write(chunk)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def safe_extract(archive: bytes, dest: Path, *, max_bytes: int) -> list[str]:
    """Unpacks ``archive`` under ``dest`` (created if missing); returns the names written."""
    dest.mkdir(parents=True, exist_ok=True)
    dest = dest.resolve()
    written: list[str] = []
    total = 0
    try:
        tar = tarfile.open(fileobj=io.BytesIO(archive), mode="r:")
    except tarfile.TarError as exc:
        raise ProtocolError(f"the sandbox sent an invalid tar archive: {exc}") from None
    with tar:
        for count, member in enumerate(tar):
            if count >= MAX_TAR_ENTRIES:
                raise TooLarge(f"the archive has more than {MAX_TAR_ENTRIES} entries")
            target = _inside(dest, member.name)
            mode = member.mode & 0o777
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                os.chmod(target, mode | 0o700)
            elif member.isfile():
                total += member.size
                if total > max_bytes:
                    raise TooLarge(f"the archive unpacks to more than max_bytes={max_bytes}")
                source = tar.extractfile(member)
                if source is None:
                    raise ProtocolError(f"the archive's file {member.name!r:.200} has no data")
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_symlink() or target.is_dir():
                    raise ProtocolError(
                        f"the archive's file {member.name!r:.200} replaces a link or directory"
                    )
                _write_atomically(target, source, mode)
            elif member.issym():
                link = PurePosixPath(member.linkname)
                resolved = (target.parent / link) if not link.is_absolute() else Path(link)
                real = Path(os.path.normpath(resolved))
                if link.is_absolute() or (real != dest and dest not in real.parents):
                    raise ProtocolError(
                        f"the archive's symlink {member.name!r:.200} points outside its directory"
                    )
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_symlink() or target.exists():
                    target.unlink()
                os.symlink(member.linkname, target)
            else:
                raise ProtocolError(
                    f"the archive's entry {member.name!r:.200} is a hard link or device; refused"
                )
            written.append(member.name)
    return written
