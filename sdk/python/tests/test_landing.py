"""Host-side landing attacked as a hostile sandbox would (issue 32): symlinks planted at the
old fixed temporary name, at the final name and in the path, link chains that only lead out
when resolved on the real tree, and hostile names in archives. Each test asserts what the
attack was after (a host file outside the destination) is untouched."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from tether_sandbox import ProtocolError, Sandbox
from tether_sandbox._tar import safe_extract

KEEP = "keep"


def _victim(tmp_path: Path, name: str = "victim") -> Path:
    victim = tmp_path / name
    victim.write_text(KEEP)
    return victim


def _links_stay_inside(dest: Path) -> None:
    """Every symlink under ``dest`` resolves (on the real tree) inside it."""
    root = dest.resolve()
    for here, dirs, files in os.walk(dest):
        for name in dirs + files:
            path = Path(here) / name
            if path.is_symlink():
                real = Path(os.path.realpath(path))
                assert real == root or root in real.parents, f"{path} leads to {real}"


def _tar(*members: tuple[str, bytes, str]) -> bytes:
    """An archive of (name, type, link target) members, files holding ``b"EVIL"``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, kind, link in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = link
            data = b"EVIL" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# --- download_file -----------------------------------------------------------------------


def test_download_file_writes_through_no_planted_link(sandbox: Sandbox, tmp_path: Path) -> None:
    # Links as a `tether sync` pull or an earlier download leaves them: one at the name the
    # SDK used to write to first, one at the final name.
    at_temp, at_final = _victim(tmp_path, "at-temp"), _victim(tmp_path, "at-final")
    out = tmp_path / "out"
    out.mkdir()
    (out / "f.tether-part").symlink_to(at_temp)
    (out / "f").symlink_to(at_final)
    sandbox.files.write("/workspace/f", "EVIL")
    assert sandbox.files.download_file("/workspace/f", out / "f") == 4
    assert at_temp.read_text() == KEEP and at_final.read_text() == KEEP
    assert not (out / "f").is_symlink() and (out / "f").read_text() == "EVIL"
    assert (out / "f").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in out.iterdir()) == ["f", "f.tether-part"], "no temporary left"


def test_a_download_dir_cannot_plant_what_download_file_follows(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    # The chain of the issue: `sub/y -> ..` is inside, and so is `sub/y/../victim` read
    # lexically, but on the real tree it is `out/../victim`.
    victim = _victim(tmp_path)
    sandbox.commands.run(
        "mkdir -p /workspace/t/sub && ln -s .. /workspace/t/sub/y"
        " && ln -s sub/y/../victim /workspace/t/f.tether-part"
        " && ln -s sub/y/../victim /workspace/t/esc && echo EVIL > /workspace/data"
    )
    out = tmp_path / "out"
    with pytest.raises(ProtocolError, match="outside"):
        sandbox.files.download_dir("/workspace/t", out)
    _links_stay_inside(out)
    assert not (out / "esc").is_symlink() and not (out / "f.tether-part").is_symlink()
    sandbox.files.download_file("/workspace/data", out / "f")
    assert victim.read_text() == KEEP


def test_download_dir_goes_through_no_planted_directory_link(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    out = tmp_path / "out"
    out.mkdir()
    (out / "d").symlink_to(outside)  # as a `tether sync` pull keeps a link of any target
    sandbox.commands.run("mkdir -p /workspace/t/d && echo EVIL > /workspace/t/d/f")
    sandbox.commands.run("chmod 777 /workspace/t/d")
    with pytest.raises(ProtocolError, match="not a directory"):
        sandbox.files.download_dir("/workspace/t", out)
    assert outside.stat().st_mode & 0o777 == 0o700, "the link's target was not chmodded"
    assert list(outside.iterdir()) == []


# --- hostile archives ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "members",
    [
        # The chain, in both orders: the second is only caught on the final check.
        [("sub/y", tarfile.SYMTYPE, ".."), ("esc", tarfile.SYMTYPE, "sub/y/../victim")],
        [("esc", tarfile.SYMTYPE, "sub/y/../victim"), ("sub/y", tarfile.SYMTYPE, "..")],
        # A link re-pointed after another was checked through it.
        [
            ("sub/y", tarfile.SYMTYPE, "."),
            ("esc", tarfile.SYMTYPE, "sub/y/../../victim"),
            ("sub/y", tarfile.SYMTYPE, ".."),
        ],
        # Through a link to a directory, then up.
        [("a", tarfile.SYMTYPE, "sub"), ("sub/b", tarfile.SYMTYPE, "../a/../../victim")],
        # A loop, and a link through it.
        [
            ("l1", tarfile.SYMTYPE, "l2"),
            ("l2", tarfile.SYMTYPE, "l1"),
            ("esc", tarfile.SYMTYPE, "l1/x"),
        ],
    ],
)
def test_link_targets_are_resolved_on_the_real_tree(
    tmp_path: Path, members: list[tuple[str, bytes, str]]
) -> None:
    victim = _victim(tmp_path)
    dest = tmp_path / "out"
    with pytest.raises(ProtocolError):
        safe_extract(_tar(*members), dest, max_bytes=100)
    _links_stay_inside(dest)
    assert victim.read_text() == KEEP


@pytest.mark.parametrize(
    "name",
    [
        "../victim",
        "/tmp/victim",
        "a/../../victim",
        "./../victim",
        "n" * 256,
        "d/" * 2100 + "f",
    ],
)
def test_hostile_names_are_refused(tmp_path: Path, name: str) -> None:
    victim = _victim(tmp_path)
    with pytest.raises(ProtocolError):
        safe_extract(_tar((name, tarfile.REGTYPE, "")), tmp_path / "out", max_bytes=100)
    assert victim.read_text() == KEEP


def test_archive_files_replace_planted_links(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "f").symlink_to(victim)
    safe_extract(_tar(("f", tarfile.REGTYPE, "")), dest, max_bytes=100)
    assert victim.read_text() == KEEP
    assert not (dest / "f").is_symlink() and (dest / "f").read_bytes() == b"EVIL"
    assert sorted(p.name for p in dest.iterdir()) == ["f"], "no temporary left"


def test_links_inside_still_land(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    names = safe_extract(
        _tar(
            ("sub/f", tarfile.REGTYPE, ""),
            ("sub/up", tarfile.SYMTYPE, ".."),
            ("to-f", tarfile.SYMTYPE, "sub/up/sub/f"),
            ("dangling", tarfile.SYMTYPE, "sub/none"),
        ),
        dest,
        max_bytes=100,
    )
    assert (dest / "to-f").read_bytes() == b"EVIL"
    assert os.readlink(dest / "dangling") == "sub/none"
    assert set(names) == {"sub/f", "sub/up", "to-f", "dangling"}
    _links_stay_inside(dest)
