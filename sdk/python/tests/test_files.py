"""Files: whole files, metadata, listings, search, edits, batches with per-file errors,
directories as tar, and watches."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from tether_sandbox import (
    AlreadyExists,
    AsyncSandbox,
    InvalidArgument,
    IsADirectory,
    NotFound,
    ProtocolError,
    Sandbox,
    TooLarge,
)
from tether_sandbox._tar import safe_extract


def test_write_read_bytes_and_text(sandbox: Sandbox) -> None:
    blob = bytes(range(256)) * 4096  # 1 MiB, every byte value
    assert sandbox.files.write("/workspace/deep/dir/blob.bin", blob) == len(blob)
    assert sandbox.files.read("/workspace/deep/dir/blob.bin") == blob
    assert sandbox.files.read("/workspace/deep/dir/blob.bin", offset=10, length=5) == blob[10:15]
    sandbox.files.write("/workspace/t.txt", "héllo\n")
    sandbox.files.write("/workspace/t.txt", "more\n", if_exists="append")
    assert sandbox.files.read_text("/workspace/t.txt") == "héllo\nmore\n"
    with pytest.raises(AlreadyExists):
        sandbox.files.write("/workspace/t.txt", "x", if_exists="fail")
    with pytest.raises(IsADirectory):
        sandbox.files.read("/workspace/deep")
    with pytest.raises(TooLarge):
        sandbox.files.read("/workspace/deep/dir/blob.bin", max_bytes=1000)


def test_stat_list_exists_mkdir_rename_remove_chmod(sandbox: Sandbox) -> None:
    f = sandbox.files
    f.mkdir("/workspace/a/b", mode=0o700)
    f.write("/workspace/a/b/c.txt", "c")
    st = f.stat("/workspace/a/b/c.txt")
    assert (st.kind, st.size, st.mode, st.name) == ("file", 1, 0o644, "c.txt")
    assert f.stat("/workspace/a/b").is_dir
    assert sorted(e.path for e in f.list("/workspace/a", depth=2)) == ["b", "b/c.txt"]
    assert f.exists("/workspace/a/b/c.txt") and not f.exists("/workspace/nope")
    f.chmod("/workspace/a/b/c.txt", 0o755)
    assert f.stat("/workspace/a/b/c.txt").mode == 0o755
    f.rename("/workspace/a/b/c.txt", "/workspace/a/d.txt")
    assert not f.exists("/workspace/a/b/c.txt") and f.read_text("/workspace/a/d.txt") == "c"
    with pytest.raises(AlreadyExists):
        f.remove("/workspace/a")
    f.remove("/workspace/a", recursive=True)
    assert not f.exists("/workspace/a")
    with pytest.raises(NotFound):
        f.stat("/workspace/a")


def test_glob_grep_edit(sandbox: Sandbox) -> None:
    f = sandbox.files
    f.write("/workspace/src/lib.rs", "fn parse_test() {}\nfn other() {}\n")
    f.write("/workspace/src/sub/main.rs", "fn main() { parse_test(); }\n")
    f.write("/workspace/src/notes.md", "parse_test\n")
    assert sorted(f.glob("**/*.rs", root="/workspace/src").paths) == ["lib.rs", "sub/main.rs"]
    g = f.grep("parse_test", "/workspace/src", glob="**/*.rs")
    assert sorted((m.path, m.line) for m in g.matches) == [("lib.rs", 1), ("sub/main.rs", 1)]
    assert not g.truncated
    assert (
        f.grep(r"fn \w+\(\)", "/workspace/src/lib.rs", regex=True).matches[1].text
        == "fn other() {}"
    )
    assert f.edit("/workspace/src/lib.rs", "fn other", "fn renamed") == 1
    assert "fn renamed() {}" in f.read_text("/workspace/src/lib.rs")
    with pytest.raises(InvalidArgument):
        f.edit("/workspace/src/lib.rs", "fn", "x")  # occurs twice
    assert f.edit("/workspace/src/lib.rs", "fn", "pub fn", replace_all=True) == 2
    with pytest.raises(NotFound):
        f.edit("/workspace/src/lib.rs", "absent text", "x")


def test_batches_report_per_file_errors(sandbox: Sandbox) -> None:
    f = sandbox.files
    f.mkdir("/workspace/adir")
    written = f.write_batch(
        [
            ("/workspace/b/one.txt", b"1"),
            ("/workspace/adir", b"oops"),
            ("/workspace/b/two.txt", "22"),
        ]
    )
    assert [(w.path, w.size) for w in written if w.ok] == [
        ("/workspace/b/one.txt", 1),
        ("/workspace/b/two.txt", 2),
    ]
    assert isinstance(written[1].error, IsADirectory)
    read = f.read_batch(["/workspace/b/one.txt", "/workspace/missing", "/workspace/b/two.txt"])
    assert [r.data for r in read] == [b"1", None, b"22"]
    assert isinstance(read[1].error, NotFound)


def test_directories_as_tar(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("A = 1\n")
    (src / "run.sh").write_text("#!/bin/sh\necho ok\n")
    (src / "run.sh").chmod(0o755)
    sandbox.files.upload_dir(src, "/workspace/proj")
    assert sandbox.commands.run("/workspace/proj/run.sh").stdout == "ok\n"
    sandbox.commands.run(
        "cd /workspace/proj && mkdir -p target && ln -s pkg/a.py link.py && echo x > target/junk"
    )
    out = tmp_path / "out"
    names = sandbox.files.download_dir("/workspace/proj", out, exclude=["target"])
    assert (out / "pkg" / "a.py").read_text() == "A = 1\n"
    assert (out / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (out / "link.py").is_symlink() and (out / "link.py").read_text() == "A = 1\n"
    assert not (out / "target").exists() and "pkg/a.py" in names


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize(
    "member",
    [
        ("../escape.txt", tarfile.REGTYPE, ""),
        ("/etc/evil", tarfile.REGTYPE, ""),
        ("link", tarfile.SYMTYPE, "/etc/passwd"),
        ("link", tarfile.SYMTYPE, "../../outside"),
        ("hard", tarfile.LNKTYPE, "/etc/passwd"),
        ("dev", tarfile.CHRTYPE, ""),
    ],
)
def test_hostile_archives_cannot_escape(tmp_path: Path, member: tuple[str, bytes, str]) -> None:
    name, kind, link = member
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    with pytest.raises(ProtocolError):
        safe_extract(
            _tar((info, b"x" if kind == tarfile.REGTYPE else b"")), tmp_path / "d", max_bytes=100
        )
    assert not (tmp_path / "escape.txt").exists()


def test_archive_through_a_symlink_is_refused(tmp_path: Path) -> None:
    link = tarfile.TarInfo("sub")
    link.type = tarfile.SYMTYPE
    link.linkname = "."
    inner = tarfile.TarInfo("sub/../../x")
    with pytest.raises(ProtocolError):
        safe_extract(_tar((link, b""), (inner, b"x")), tmp_path / "d", max_bytes=100)
    big = tarfile.TarInfo("big")
    with pytest.raises(TooLarge):
        safe_extract(_tar((big, b"x" * 200)), tmp_path / "e", max_bytes=100)


def test_an_interrupted_extraction_leaves_no_partial_file(tmp_path: Path) -> None:
    # The archive breaks off inside its second file, which already exists at the destination.
    first, second = tarfile.TarInfo("first"), tarfile.TarInfo("second")
    whole = _tar((first, b"1" * 1000), (second, b"2" * (3 << 20)))
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "second").write_bytes(b"old")
    with pytest.raises(tarfile.TarError):
        safe_extract(whole[: 2 << 20], dest, max_bytes=10 << 20)
    assert (dest / "first").read_bytes() == b"1" * 1000
    assert (dest / "second").read_bytes() == b"old"
    assert sorted(p.name for p in dest.iterdir()) == ["first", "second"]


def test_stream_files_to_and_from_the_host(sandbox: Sandbox, tmp_path: Path) -> None:
    local = tmp_path / "in.bin"
    local.write_bytes(b"\x00\xff" * 300_000)
    assert sandbox.files.upload_file(local, "/workspace/in.bin") == 600_000
    assert sandbox.files.download_file("/workspace/in.bin", tmp_path / "out.bin") == 600_000
    assert (tmp_path / "out.bin").read_bytes() == local.read_bytes()


def test_watch_reports_changes(sandbox: Sandbox) -> None:
    sandbox.files.mkdir("/workspace/w")
    watch = sandbox.files.watch("/workspace/w")
    try:
        sandbox.files.write("/workspace/w/new.txt", "x")
        seen = set()
        while "new.txt" not in seen:
            event = watch.next(timeout=10)
            assert event is not None
            if event.path is not None:
                seen.add(event.path)
    finally:
        watch.close()


async def test_async_files(asandbox: AsyncSandbox) -> None:
    await asandbox.files.write("/workspace/x", b"abc")
    assert await asandbox.files.read("/workspace/x") == b"abc"
    watch = await asandbox.files.watch("/workspace")
    await asandbox.files.remove("/workspace/x")
    async for event in watch:
        if event.kind == "remove" and event.path == "x":
            break
    await watch.close()
