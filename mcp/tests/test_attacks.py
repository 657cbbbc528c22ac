"""What a hostile MCP client or a hostile sandbox tries: host paths outside --allow-dir,
`..`, symlinks planted by the sandbox that point out of the allowed directory, and HTTP
requests without the right token."""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
from conftest import HTTP_TOKEN, TETHER, Dirs, HttpServer, Relay, http_client, start_http, stdio_session, stop
from helpers import call, fail
from mcp import ClientSession

pytestmark = pytest.mark.anyio


@pytest.fixture
async def session(relay: Relay, dirs: Dirs) -> AsyncIterator[ClientSession]:
    async with stdio_session(relay, dirs) as s:
        yield s


@pytest.fixture
async def sandbox(session: ClientSession) -> AsyncIterator[str]:
    created = await call(session, "sandbox_create", labels={"attacks": uuid.uuid4().hex})
    yield created["id"]
    await call(session, "sandbox_delete", sandbox_id=created["id"])


def outside_listing(dirs: Dirs) -> set[str]:
    return {str(p.relative_to(dirs.outside)) for p in dirs.outside.rglob("*")}


async def test_host_paths_outside_the_allowed_dirs(session: ClientSession, sandbox: str, dirs: Dirs) -> None:
    before = outside_listing(dirs)
    secret = dirs.outside / "secret.txt"
    for host_path in [str(secret), f"../outside/{secret.name}", "/etc/passwd"]:
        error = await fail(session, "upload", sandbox_id=sandbox, host_path=host_path, sandbox_path="/workspace/x")
        assert error["code"] == "path_not_allowed", error
    await call(session, "write_file", sandbox_id=sandbox, path="/workspace/payload", content="pwned\n")
    for host_path in [str(dirs.outside / "dropped"), "../outside/dropped", str(dirs.outside)]:
        error = await fail(
            session, "download", sandbox_id=sandbox, sandbox_path="/workspace/payload", host_path=host_path
        )
        assert error["code"] == "path_not_allowed", error
    out = await call(session, "exec", sandbox_id=sandbox, command="test -e /workspace/x && echo leaked || echo clean")
    assert out["output"] == "clean\n"
    assert outside_listing(dirs) == before


async def test_symlinks_from_the_sandbox_lead_nowhere(session: ClientSession, sandbox: str, dirs: Dirs) -> None:
    before = outside_listing(dirs)
    case = uuid.uuid4().hex
    # The sandbox plants a link to the host's forbidden directory (by its host path), and a
    # directory named like the link, full of files, to be downloaded through it next.
    await call(
        session,
        "exec",
        sandbox_id=sandbox,
        command=f"mkdir -p /workspace/{case}/link /workspace/evil && ln -s {dirs.outside} /workspace/evil/link "
        f"&& ln -s {dirs.outside}/secret.txt /workspace/evil/secret && echo pwned > /workspace/{case}/link/planted",
    )
    down = await call(session, "download", sandbox_id=sandbox, sandbox_path="/workspace/evil", host_path=f"{case}-evil")
    assert down["symlinks"] == 2
    landed = dirs.allowed / f"{case}-evil"
    assert os.readlink(landed / "link") == str(dirs.outside)

    # Writing through the planted link: refused, whichever way it is asked.
    error = await fail(
        session, "download", sandbox_id=sandbox, sandbox_path=f"/workspace/{case}/link", host_path=f"{case}-evil"
    )
    assert error["code"] == "path_not_allowed", error
    error = await fail(
        session,
        "download",
        sandbox_id=sandbox,
        sandbox_path=f"/workspace/{case}/link/planted",
        host_path=f"{case}-evil/link/planted",
    )
    assert error["code"] == "path_not_allowed", error
    error = await fail(
        session,
        "download",
        sandbox_id=sandbox,
        sandbox_path=f"/workspace/{case}/link/planted",
        host_path=f"{case}-evil/secret",
    )
    assert error["code"] == "path_not_allowed", error
    # Reading through it: refused too.
    for host_path in [f"{case}-evil/link/secret.txt", f"{case}-evil/secret", f"{case}-evil/link"]:
        error = await fail(session, "upload", sandbox_id=sandbox, host_path=host_path, sandbox_path="/workspace/stolen")
        assert error["code"] == "path_not_allowed", error
    assert outside_listing(dirs) == before
    assert (dirs.outside / "secret.txt").read_text() == "host secret\n"

    # Uploading the allowed directory that holds the links sends links, not their targets.
    await call(session, "upload", sandbox_id=sandbox, host_path=f"{case}-evil", sandbox_path="/workspace/back")
    out = await call(
        session,
        "exec",
        sandbox_id=sandbox,
        command="readlink /workspace/back/secret; cat /workspace/back/secret 2>&1 | head -c 40",
    )
    assert out["output"].startswith(f"{dirs.outside}/secret.txt\n")
    assert "host secret" not in out["output"]


async def test_download_lands_through_the_cli_landers(session: ClientSession, sandbox: str, dirs: Dirs) -> None:
    # Issue 32's attacks on the SDKs, against `download`, which lands through `tether cp`'s
    # landers (commit e05e564): links an earlier download left at a file's name (to a file
    # inside the allowed directory, so the path checks pass), at the old fixed temporary name,
    # and in a directory's place in a tree.
    before = outside_listing(dirs)
    case = dirs.allowed / uuid.uuid4().hex
    case.mkdir()
    victim = case / "victim"
    victim.write_text("keep\n")
    (case / "f").symlink_to("victim")
    (case / "f.tether-part").symlink_to("victim")
    await call(session, "write_file", sandbox_id=sandbox, path="/workspace/payload", content="pwned\n")
    down = await call(
        session, "download", sandbox_id=sandbox, sandbox_path="/workspace/payload", host_path=str(case / "f")
    )
    assert down["files"] == 1
    assert victim.read_text() == "keep\n", "written through the link at the final name"
    assert not (case / "f").is_symlink() and (case / "f").read_text() == "pwned\n"
    assert sorted(p.name for p in case.iterdir()) == ["f", "f.tether-part", "victim"]

    # A tree into a directory holding a link where the tree has a directory: refused, and
    # nothing written or chmodded through it; the link at a file's name is replaced.
    tree = case / "tree"
    tree.mkdir()
    (tree / "d").symlink_to(dirs.outside)
    (tree / "g").symlink_to("../victim")
    await call(
        session,
        "exec",
        sandbox_id=sandbox,
        command="mkdir -p /workspace/tree/d && echo pwned > /workspace/tree/g && echo pwned > /workspace/tree/d/x "
        "&& chmod 777 /workspace/tree/d",
    )
    mode = stat.S_IMODE(dirs.outside.stat().st_mode)
    await fail(session, "download", sandbox_id=sandbox, sandbox_path="/workspace/tree", host_path=str(case))
    assert stat.S_IMODE(dirs.outside.stat().st_mode) == mode
    assert outside_listing(dirs) == before
    assert victim.read_text() == "keep\n"


async def test_http_needs_the_token(http_server: HttpServer) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx2.AsyncClient(timeout=30) as http:
        for auth in [None, "Bearer wrong-token-000000000000", "Basic abc", "Bearer"]:
            h = dict(headers)
            if auth:
                h["Authorization"] = auth
            resp = await http.post(http_server.url, json=body, headers=h)
            assert resp.status_code == 401, (auth, resp.status_code, resp.text)
            assert resp.json()["error"]["code"] == "unauthorized"
            assert resp.headers["www-authenticate"] == "Bearer"
            assert resp.headers["connection"] == "close"
    with pytest.raises(BaseException):  # noqa: B017 - the client surfaces 401 in its own ways
        async with http_client(http_server.url, token="wrong-token-0000000000000000"):
            pass
    # The right token works.
    async with http_client(http_server.url) as s:
        assert (await s.list_tools()).tools


async def test_http_refuses_foreign_host_names(http_server: HttpServer) -> None:
    # DNS rebinding: a page on evil.example that resolves to 127.0.0.1 sends its own Host.
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {HTTP_TOKEN}",
        "Host": "evil.example",
    }
    async with httpx2.AsyncClient(timeout=30) as http:
        resp = await http.post(http_server.url, json=body, headers=headers)
    assert resp.status_code in {400, 403, 421}, (resp.status_code, resp.text)


async def test_the_http_token_sources(relay: Relay, dirs: Dirs) -> None:
    with tempfile.TemporaryDirectory() as home:
        # No token given: one is generated into the data directory, readable by the owner only.
        server = start_http(relay, dirs, [], {"TETHER_HOME": home})
        try:
            token_file = Path(home) / "mcp.token"
            assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
            token = token_file.read_text().strip()
            assert len(token) == 64
            async with http_client(server.url, token=token) as s:
                assert (await s.list_tools()).tools
        finally:
            stop(server.proc)

        # --token-file wins over the environment.
        mine = Path(home) / "mine.token"
        mine.write_text("from-the-file-0123456789\n")
        server = start_http(relay, dirs, ["--token-file", str(mine)], {"TETHER_MCP_TOKEN": HTTP_TOKEN})
        try:
            async with http_client(server.url, token="from-the-file-0123456789") as s:
                assert (await s.list_tools()).tools
            async with httpx2.AsyncClient(timeout=30) as http:
                resp = await http.post(server.url, json={}, headers={"Authorization": f"Bearer {HTTP_TOKEN}"})
            assert resp.status_code == 401
        finally:
            stop(server.proc)


def test_a_guessable_token_is_refused_at_start(relay: Relay, tmp_path: Path) -> None:
    short = tmp_path / "short.token"
    short.write_text("short")
    done = subprocess.run(
        [TETHER, "mcp", "--listen", "127.0.0.1:0", "--token-file", str(short)],
        env=relay.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "shorter than 16" in done.stderr
