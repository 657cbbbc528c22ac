"""Exec sessions: they live in the server, so a client that disconnects and reconnects polls
on from its cursor, and no byte of output is lost however much there is."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from conftest import Dirs, HttpServer, Relay, http_client, modern_http_client, stdio_session
from helpers import call, fail, structured
from mcp import ClientSession

pytestmark = pytest.mark.anyio


@pytest.fixture
async def sandbox(http_server: HttpServer) -> AsyncIterator[str]:
    async with http_client(http_server.url) as s:
        created = await call(s, "sandbox_create", labels={"sessions": uuid.uuid4().hex})
    yield created["id"]
    async with http_client(http_server.url) as s:
        await call(s, "sandbox_delete", sandbox_id=created["id"])


async def poll_until(s: ClientSession, session_id: str, cursor: int, want: str) -> tuple[str, int]:
    """Polls until the output from `cursor` contains `want`; returns it and the new cursor."""
    out = ""
    for _ in range(200):
        got = await call(s, "exec_poll", session_id=session_id, cursor=cursor, wait_ms=500)
        assert "lost" not in got, got
        out += got["output"]
        cursor = got["cursor"]
        if want in out:
            return out, cursor
        assert got["running"], f"the process ended before printing {want!r}: {out!r}"
    raise AssertionError(f"{want!r} never came: {out!r}")


async def poll_to_exit(
    s: ClientSession, session_id: str, cursor: int, max_bytes: int = 65536
) -> tuple[bytes, dict[str, Any]]:
    out = b""
    for _ in range(2000):
        got = await call(s, "exec_poll", session_id=session_id, cursor=cursor, wait_ms=1000, max_bytes=max_bytes)
        assert "lost" not in got, got
        out += got["output"].encode()
        assert got["cursor"] == cursor + len(got["output"].encode())
        cursor = got["cursor"]
        if not got["running"] and got["pending_bytes"] == 0:
            return out, got
    raise AssertionError("the process never ended")


async def test_a_session_survives_the_client_reconnecting(http_server: HttpServer, sandbox: str) -> None:
    async with http_client(http_server.url) as first:
        started = await call(first, "exec_start", sandbox_id=sandbox, command="cat; echo done")
        sid = started["session_id"]
        assert started["cursor"] == 0
        await call(first, "exec_write_stdin", session_id=sid, input="hello\n")
        out, cursor = await poll_until(first, sid, 0, "hello\n")
        assert out == "hello\n" and cursor == 6

    # A new connection (a new MCP session) finds the exec session by its id.
    async with http_client(http_server.url) as second:
        listed = await call(second, "exec_list")
        assert {"session_id": sid, "sandbox_id": sandbox, "command": "cat; echo done", "running": True} in listed[
            "sessions"
        ]
        await call(second, "exec_write_stdin", session_id=sid, input="world\n", close_stdin=True)
        rest, final = await poll_to_exit(second, sid, cursor)
        assert rest == b"world\ndone\n"
        assert final["exit_code"] == 0 and final["timed_out"] is False
        error = await fail(second, "exec_write_stdin", session_id=sid, input="late")
        assert error["code"] == "session_ended"
        # Polling again at the end repeats the exit.
        again = await call(second, "exec_poll", session_id=sid, wait_ms=0)
        assert again["output"] == "" and again["exit_code"] == 0


async def test_no_output_is_lost_across_reconnections(http_server: HttpServer, sandbox: str) -> None:
    # 6.9 MB: more than the agent's replay ring (1 MiB) and the server's buffer (4 MiB), so
    # the server must hold the process back, not drop output, while nobody polls.
    n = 1_000_000
    expected = "".join(f"{i}\n" for i in range(1, n + 1)).encode()
    async with http_client(http_server.url) as first:
        sid = (await call(first, "exec_start", sandbox_id=sandbox, command=f"seq 1 {n}"))["session_id"]
        got = await call(first, "exec_poll", session_id=sid, cursor=0, max_bytes=100_000, wait_ms=5000)
        head = got["output"].encode()
        cursor = got["cursor"]
        assert 0 < len(head) <= 100_000
    async with http_client(http_server.url) as second:
        rest, final = await poll_to_exit(second, sid, cursor, max_bytes=65536)
    assert head + rest == expected
    assert final["exit_code"] == 0


async def test_signals_end_a_session(http_server: HttpServer, sandbox: str) -> None:
    async with http_client(http_server.url) as s:
        sid = (
            await call(
                s,
                "exec_start",
                sandbox_id=sandbox,
                command="trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.1; done",
            )
        )["session_id"]
        _, cursor = await poll_until(s, sid, 0, "ready\n")
        await call(s, "exec_signal", session_id=sid, signal="TERM", process_only=True)
        out, final = await poll_to_exit(s, sid, cursor)
        assert out == b"got TERM\n" and final["exit_code"] == 7

        sid = (await call(s, "exec_start", sandbox_id=sandbox, command="sleep 600", timeout_seconds=1))["session_id"]
        _, final = await poll_to_exit(s, sid, 0)
        assert final["timed_out"] is True and final["exit_code"] == 124

        sid = (await call(s, "exec_start", sandbox_id=sandbox, command="sleep 600"))["session_id"]
        error = await fail(s, "exec_signal", session_id=sid, signal="NOTASIGNAL")
        assert error["code"] == "invalid_argument"
        error = await fail(s, "exec_signal", session_id=sid, signal="TERM; rm -rf /")
        assert error["code"] == "invalid_argument"
        await call(s, "exec_signal", session_id=sid, signal="KILL")
        _, final = await poll_to_exit(s, sid, 0)
        assert final["exit_code"] == 137

        error = await fail(s, "exec_poll", session_id="es-nope")
        assert error["code"] == "session_not_found"
        error = await fail(s, "exec_poll", session_id=sid, cursor=10**9)
        assert error["code"] == "invalid_argument"


async def test_a_terminal_session(http_server: HttpServer, sandbox: str) -> None:
    async with http_client(http_server.url) as s:
        sid = (
            await call(
                s, "exec_start", sandbox_id=sandbox, command="test -t 0 && echo tty; read x; echo got $x", pty=True
            )
        )["session_id"]
        _, cursor = await poll_until(s, sid, 0, "tty")
        await call(s, "exec_write_stdin", session_id=sid, input="abc\n")
        out, final = await poll_to_exit(s, sid, cursor)
        assert b"got abc" in out and final["exit_code"] == 0


async def test_a_session_reattaches_after_the_relay_restarts(
    http_server: HttpServer, relay: Relay, sandbox: str
) -> None:
    async with http_client(http_server.url) as s:
        sid = (await call(s, "exec_start", sandbox_id=sandbox, command="cat"))["session_id"]
        await call(s, "exec_write_stdin", session_id=sid, input="before\n")
        _, cursor = await poll_until(s, sid, 0, "before\n")

        relay.restart()
        # The server notices the lost connection and re-attaches from the offset it holds;
        # input written meanwhile fails as `disconnected` and is written again.
        for _ in range(100):
            result = await s.call_tool("exec_write_stdin", {"session_id": sid, "input": "after\n"})
            if not result.is_error:
                break
            assert result.structured_content["error"]["code"] == "disconnected", result
            await call(s, "exec_poll", session_id=sid, cursor=cursor, wait_ms=100)
        else:
            raise AssertionError("the session never re-attached")
        await call(s, "exec_write_stdin", session_id=sid, close_stdin=True)
        out, final = await poll_to_exit(s, sid, cursor)
        assert out == b"after\n" and final["exit_code"] == 0


async def test_a_stdio_server_ends_its_sessions_when_it_stops(relay: Relay, dirs: Dirs) -> None:
    async with stdio_session(relay, dirs) as s:
        sandbox = (await call(s, "sandbox_create", labels={"stdio-stop": uuid.uuid4().hex}))["id"]
        sid = (await call(s, "exec_start", sandbox_id=sandbox, command="echo up; exec sleep 4242"))["session_id"]
        await poll_until(s, sid, 0, "up\n")
    # Nobody can follow that process any more: the server killed it on its way out.
    async with stdio_session(relay, dirs) as s:
        try:
            out = await call(s, "exec", sandbox_id=sandbox, command="pgrep -x sleep || echo none")
            assert out["output"] == "none\n", out
        finally:
            await call(s, "sandbox_delete", sandbox_id=sandbox)


async def test_sessions_across_protocol_revisions(http_server: HttpServer, sandbox: str) -> None:
    # The 2026-07-28 revision has no MCP sessions at all (every request stands alone); exec
    # sessions do not depend on them, so a modern client and a legacy one share one.
    async with modern_http_client(http_server.url) as modern:
        assert modern.protocol_version == "2026-07-28"
        started = await modern.call_tool("exec_start", {"sandbox_id": sandbox, "command": "echo from-modern"})
        sid = structured(started)["session_id"]
    async with http_client(http_server.url) as legacy:
        out, final = await poll_to_exit(legacy, sid, 0)
        assert out == b"from-modern\n" and final["exit_code"] == 0


async def test_deleting_a_sandbox_ends_its_sessions(http_server: HttpServer) -> None:
    async with http_client(http_server.url) as s:
        sandbox = (await call(s, "sandbox_create", labels={"delete": uuid.uuid4().hex}))["id"]
        sid = (await call(s, "exec_start", sandbox_id=sandbox, command="sleep 600"))["session_id"]
        deleted = await call(s, "sandbox_delete", sandbox_id=sandbox)
        assert deleted == {"deleted": sandbox, "exec_sessions_ended": 1}
        error = await fail(s, "exec_poll", session_id=sid)
        assert error["code"] == "session_not_found"
        error = await fail(s, "exec", sandbox_id=sandbox, command="true")
        assert error["code"] in {"not_found", "gone"}, error
