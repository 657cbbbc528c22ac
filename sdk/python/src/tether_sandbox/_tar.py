"""Tar archives on the host side: packing a host directory for upload, and unpacking an
archive the sandbox sent without letting it write outside its destination.

The archive comes from a hostile sandbox, so extraction is by hand, entry by entry, and
every entry lands through :mod:`._landing` (names checked, no link followed, files under
random temporary names renamed into place, symlinks made last and only when they lead
inside the destination on the real tree): regular files, directories and symlinks only (hard
links and devices are refused), sizes capped, and no permission bits beyond 0o777 (no
setuid).
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from ._constants import MAX_TAR_ENTRIES
from ._landing import Dest, entry_parts
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


def safe_extract(archive: bytes, dest: Path, *, max_bytes: int) -> list[str]:
    """Unpacks ``archive`` under ``dest`` (created if missing) through :mod:`._landing`;
    returns the names written. Stops at the first entry it refuses; what landed before it
    stays (all of it inside ``dest``)."""
    written: list[str] = []
    total = 0
    try:
        tar = tarfile.open(fileobj=io.BytesIO(archive), mode="r:")
    except tarfile.TarError as exc:
        raise ProtocolError(f"the sandbox sent an invalid tar archive: {exc}") from None
    with tar, Dest(dest, create=True) as landing:
        for count, member in enumerate(tar):
            if count >= MAX_TAR_ENTRIES:
                raise TooLarge(f"the archive has more than {MAX_TAR_ENTRIES} entries")
            parts = entry_parts(member.name)
            if member.isdir():
                landing.mkdir(parts, member.mode)
            elif member.isfile():
                total += member.size
                if total > max_bytes:
                    raise TooLarge(f"the archive unpacks to more than max_bytes={max_bytes}")
                source = tar.extractfile(member)
                if source is None:
                    raise ProtocolError(f"the archive's file {member.name!r:.200} has no data")
                landing.write_file(parts, source, member.mode)
            elif member.issym():
                # Made last, once nothing else will be written: see _landing.
                landing.add_symlink(parts, member.linkname)
                continue
            else:
                raise ProtocolError(
                    f"the archive's entry {member.name!r:.200} is a hard link or device; refused"
                )
            written.append(member.name)
        written += landing.symlinks()
    return written
