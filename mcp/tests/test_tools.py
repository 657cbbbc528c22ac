"""Every tool over stdio and over streamable HTTP, against a real relay and local sandboxes:
the tool list, each input schema (validated as JSON Schema, and against good and bad
arguments), and each tool's observable contract."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import jsonschema
import pytest
from conftest import Dirs, HttpServer, Relay, http_client, modern_http_client, modern_stdio_client, stdio_session
from helpers import TOOLS, call, fail
from mcp import ClientSession

pytestmark = pytest.mark.anyio

# Arguments each tool accepts (sandbox and session ids filled in by the test), checked
# against the tool's own schema.
GOOD_ARGS: dict[str, dict[str, Any]] = {
    "sandbox_create": {"labels": {"a": "b"}, "ttl_seconds": 600, "provider": "local"},
    "sandbox_list": {},
    "sandbox_delete": {"sandbox_id": "sb-1"},
    "sandbox_info": {"sandbox_id": "sb-1"},
    "sandbox_pause": {"sandbox_id": "sb-1"},
    "sandbox_resume": {"sandbox_id": "sb-1"},
    "sandbox_stop": {"sandbox_id": "sb-1"},
    "sandbox_start": {"sandbox_id": "sb-1"},
    "exec": {"sandbox_id": "sb-1", "command": "ls", "cwd": "/tmp", "timeout_seconds": 5},
    "exec_start": {"sandbox_id": "sb-1", "command": "cat", "pty": True},
    "exec_poll": {"session_id": "es-1", "cursor": 0, "wait_ms": 10, "max_bytes": 100},
    "exec_write_stdin": {"session_id": "es-1", "input": "x\n", "close_stdin": True},
    "exec_signal": {"session_id": "es-1", "signal": "TERM"},
    "exec_list": {},
    "read_file": {"sandbox_id": "sb-1", "path": "/f", "start_line": 2, "line_count": 3},
    "write_file": {"sandbox_id": "sb-1", "path": "/f", "content": "x"},
    "edit_file": {"sandbox_id": "sb-1", "path": "/f", "old_string": "a", "new_string": "b"},
    "ls": {"sandbox_id": "sb-1", "path": "/", "depth": 2},
    "glob": {"sandbox_id": "sb-1", "pattern": "**/*.py", "root": "/"},
    "grep": {"sandbox_id": "sb-1", "pattern": "x", "regex": True, "limit": 10},
    "upload": {"sandbox_id": "sb-1", "host_path": "a", "sandbox_path": "/a"},
    "download": {"sandbox_id": "sb-1", "sandbox_path": "/a", "host_path": "a"},
}

# Arguments each schema must refuse.
BAD_ARGS: dict[str, dict[str, Any]] = {
    "sandbox_create": {"labels": "not-an-object"},
    "sandbox_list": {"unknown": 1},
    "sandbox_delete": {},
    "sandbox_info": {"sandbox_id": 7},
    "sandbox_pause": {},
    "sandbox_resume": {"sandbox_id": 7},
    "sandbox_stop": {"sandbox_id": "sb-1", "force": True},
    "sandbox_start": {},
    "exec": {"sandbox_id": "sb-1"},
    "exec_start": {"command": "ls"},
    "exec_poll": {"session_id": "es-1", "cursor": -1},
    "exec_write_stdin": {"input": "x"},
    "exec_signal": {"session_id": "es-1"},
    "exec_list": {"x": 1},
    "read_file": {"sandbox_id": "sb-1", "path": "/f", "start_line": 0},
    "write_file": {"sandbox_id": "sb-1", "path": "/f"},
    "edit_file": {"sandbox_id": "sb-1", "path": "/f", "old_string": "a"},
    "ls": {"sandbox_id": "sb-1", "depth": 99},
    "glob": {"sandbox_id": "sb-1"},
    "grep": {"sandbox_id": "sb-1", "pattern": "x", "limit": 0},
    "upload": {"sandbox_id": "sb-1", "host_path": "a"},
    "download": {"sandbox_id": "sb-1", "host_path": "a"},
}

Connect = Callable[[], AbstractAsyncContextManager[ClientSession]]


@pytest.fixture(params=["stdio", "http", "stdio-2026", "http-2026"])
def connect(request: pytest.FixtureRequest, relay: Relay, dirs: Dirs) -> Connect:
    """Each transport, with the initialize handshake (what hosts speak today) and with the
    2026-07-28 revision (no handshake, every request standing alone)."""
    if request.param == "stdio":
        return lambda: stdio_session(relay, dirs)
    if request.param == "stdio-2026":
        return lambda: modern_stdio_client(relay, dirs)
    server: HttpServer = request.getfixturevalue("http_server")
    if request.param == "http-2026":
        return lambda: modern_http_client(server.url)
    return lambda: http_client(server.url)


@pytest.fixture
async def session(connect: Connect) -> AsyncIterator[ClientSession]:
    async with connect() as s:
        yield s


@pytest.fixture
async def sandbox(session: ClientSession) -> AsyncIterator[str]:
    label = uuid.uuid4().hex
    created = await call(session, "sandbox_create", labels={"test": label}, ttl_seconds=900)
    assert created["created"] is True and created["state"] == "running"
    yield created["id"]
    await call(session, "sandbox_delete", sandbox_id=created["id"])


async def test_tools_are_listed_with_valid_schemas(session: ClientSession) -> None:
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == TOOLS
    for name, tool in tools.items():
        assert tool.description and len(tool.description) > 40, name
        schema = tool.input_schema
        assert schema["type"] == "object", name
        for field, spec in schema.get("properties", {}).items():
            assert spec.get("description") and "\n" not in spec["description"], (name, field)
        jsonschema.validators.validator_for(schema).check_schema(schema)
        validator = jsonschema.validators.validator_for(schema)(schema)
        validator.validate(GOOD_ARGS[name])
        assert not validator.is_valid(BAD_ARGS[name]), f"{name} accepts {BAD_ARGS[name]}"


async def test_arguments_the_schema_refuses_are_tool_errors(session: ClientSession) -> None:
    # A tool error, not a protocol error: the model sees the message and can correct itself.
    for tool, args in BAD_ARGS.items():
        error = await fail(session, tool, **args)
        assert error["code"] == "invalid_argument", (tool, error)
    error = await fail(session, "exec", sandbox_id="sb-1", command="ls", timeout_seconds="soon")
    assert "timeout_seconds" in error["message"] or "invalid type" in error["message"], error


async def test_numbers_sent_as_strings_and_a_short_default_ttl(session: ClientSession) -> None:
    # The MCP Inspector sends every form field as a string: a number's field takes it.
    asked = await call(session, "sandbox_create", labels={"test": "strings"}, ttl_seconds=" 900")
    # A model that names no TTL gets an hour, not the relay's day.
    default = await call(session, "sandbox_create", labels={"test": "default-ttl"})
    try:
        for info, ttl in ((asked, 900), (default, 3600)):
            left = (info["expires_ms"] - info["created_ms"]) / 1000
            assert ttl - 5 <= left <= ttl + 5, (info, ttl)
        error = await fail(session, "sandbox_create", ttl_seconds="an hour")
        assert error["code"] == "invalid_argument", error
        assert error["message"] == 'ttl_seconds must be a whole number, not "an hour"', error
    finally:
        for info in (asked, default):
            await call(session, "sandbox_delete", sandbox_id=info["id"])


async def test_the_lifecycle_tools(session: ClientSession, sandbox: str) -> None:
    listed = await call(session, "sandbox_list")
    assert sandbox in [s["id"] for s in listed["sandboxes"]]
    mine = (await call(session, "sandbox_info", sandbox_id=sandbox))["sandbox"]
    found = await call(session, "sandbox_list", labels=mine["labels"])
    assert [s["id"] for s in found["sandboxes"]] == [sandbox]
    again = await call(session, "sandbox_create", labels=mine["labels"], get_or_create=True)
    assert again["id"] == sandbox and again["created"] is False

    # A server listening in the sandbox gets a preview URL.
    start = await call(session, "exec_start", sandbox_id=sandbox, command="exec python3 -m http.server 8123")
    info: dict[str, Any] = {}
    for _ in range(300):
        info = await call(session, "sandbox_info", sandbox_id=sandbox)
        if any(p["port"] == 8123 for p in info["listening_ports"]):
            break
        await call(session, "exec_poll", session_id=start["session_id"], wait_ms=100)
    port = next(p for p in info["listening_ports"] if p["port"] == 8123)
    assert "8123" in port["url"] and "tether_preview_token=" in port["url"]
    assert info["agent"]["agent_version"] and info["agent"]["cpus"] >= 1
    assert info["preview"]["token"]
    await call(session, "exec_signal", session_id=start["session_id"], signal="KILL")

    error = await fail(session, "sandbox_info", sandbox_id="sb-doesnotexist")
    assert error["code"] == "not_found"
    error = await fail(session, "sandbox_info", sandbox_id="../v1/tokens")
    assert error["code"] == "invalid_argument"
    error = await fail(session, "sandbox_create", provider="no-such-provider")
    assert error["code"] in {"invalid_argument", "forbidden", "not_found"}, error


async def test_pause_resume_stop_and_start(session: ClientSession, sandbox: str) -> None:
    await call(session, "write_file", sandbox_id=sandbox, path="/workspace/kept", content="kept")
    assert (await call(session, "sandbox_pause", sandbox_id=sandbox))["state"] == "paused"
    # Looking does not wake it.
    info = await call(session, "sandbox_info", sandbox_id=sandbox)
    assert info["sandbox"]["state"] == "paused", info
    error = await fail(session, "sandbox_pause", sandbox_id=sandbox)
    assert error["code"] == "conflict" and "tether resume" in error["message"], error
    # The next tool that reaches it resumes it.
    out = await call(session, "exec", sandbox_id=sandbox, command="cat /workspace/kept")
    assert out["output"] == "kept", out
    info = await call(session, "sandbox_info", sandbox_id=sandbox)
    assert info["sandbox"]["state"] == "running", info

    assert (await call(session, "sandbox_stop", sandbox_id=sandbox))["state"] == "stopped"
    error = await fail(session, "sandbox_resume", sandbox_id=sandbox)
    assert error["code"] == "conflict", error
    # The next tool that reaches it starts it, its files as they were.
    out = await call(session, "exec", sandbox_id=sandbox, command="cat /workspace/kept")
    assert out["output"] == "kept", out
    error = await fail(session, "sandbox_start", sandbox_id=sandbox)
    assert error["code"] == "conflict", error
    await call(session, "sandbox_stop", sandbox_id=sandbox)
    assert (await call(session, "sandbox_start", sandbox_id=sandbox))["state"] == "running"


async def test_exec(session: ClientSession, sandbox: str) -> None:
    out = await call(session, "exec", sandbox_id=sandbox, command="echo out; echo err >&2; exit 3")
    assert out["output"] == "out\nerr\n"
    assert out["exit_code"] == 3 and out["timed_out"] is False and out["truncated"] is False

    out = await call(session, "exec", sandbox_id=sandbox, command="pwd", cwd="/tmp")
    assert out["output"] == "/tmp\n"
    out = await call(session, "exec", sandbox_id=sandbox, command="echo $X", env={"X": "y"})
    assert out["output"] == "y\n"

    out = await call(session, "exec", sandbox_id=sandbox, command="echo started; sleep 60", timeout_seconds=1)
    assert out["timed_out"] is True and out["exit_code"] == 124
    assert out["output"] == "started\n"

    out = await call(session, "exec", sandbox_id=sandbox, command="kill -9 $$")
    assert out["exit_code"] == 137 and out["signal"] == 9

    # 588,895 bytes: folded to head and tail, kept whole in a file in the sandbox.
    out = await call(session, "exec", sandbox_id=sandbox, command="seq 1 100000")
    assert out["truncated"] is True and out["output_bytes"] == 588895
    assert out["output"].startswith("1\n2\n3\n") and out["output"].endswith("99999\n100000\n")
    assert "bytes omitted" in out["output"] and len(out["output"]) < 40_000
    kept = out["output_file"]
    whole = await call(session, "read_file", sandbox_id=sandbox, path=kept, start_line=50000, line_count=2)
    assert whole["content"] == "50000\n50001\n" and whole["total_lines"] == 100000

    error = await fail(session, "exec", sandbox_id=sandbox, command="  ")
    assert error["code"] == "invalid_argument"
    error = await fail(session, "exec", sandbox_id=sandbox, command="ls", cwd="/no/such/dir")
    assert error["code"] in {"not_found", "invalid_argument"}, error


async def test_file_tools(session: ClientSession, sandbox: str) -> None:
    text = "".join(f"line {i}\n" for i in range(1, 11))
    wrote = await call(session, "write_file", sandbox_id=sandbox, path="/workspace/src/a.txt", content=text)
    assert wrote["written_bytes"] == len(text)

    got = await call(session, "read_file", sandbox_id=sandbox, path="/workspace/src/a.txt")
    assert got["content"] == text and got["total_lines"] == 10 and got["more_lines"] is False
    got = await call(session, "read_file", sandbox_id=sandbox, path="/workspace/src/a.txt", start_line=3, line_count=2)
    assert got["content"] == "line 3\nline 4\n"
    assert (got["start_line"], got["end_line"], got["more_lines"]) == (3, 4, True)

    edited = await call(
        session,
        "edit_file",
        sandbox_id=sandbox,
        path="/workspace/src/a.txt",
        old_string="line 5\n",
        new_string="five\n",
    )
    assert edited["replacements"] == 1
    error = await fail(
        session,
        "edit_file",
        sandbox_id=sandbox,
        path="/workspace/src/a.txt",
        old_string="line",
        new_string="LINE",
    )
    assert error["code"] == "invalid_argument"  # more than one occurrence
    edited = await call(
        session,
        "edit_file",
        sandbox_id=sandbox,
        path="/workspace/src/a.txt",
        old_string="line",
        new_string="LINE",
        replace_all=True,
    )
    assert edited["replacements"] == 9
    got = await call(session, "read_file", sandbox_id=sandbox, path="/workspace/src/a.txt", start_line=5, line_count=1)
    assert got["content"] == "five\n"

    await call(session, "write_file", sandbox_id=sandbox, path="/workspace/src/deep/b.py", content="print('x')\n")
    listed = await call(session, "ls", sandbox_id=sandbox, path="/workspace/src")
    kinds = {e["path"]: e["kind"] for e in listed["entries"]}
    assert kinds == {"a.txt": "file", "deep": "dir"}
    listed = await call(session, "ls", sandbox_id=sandbox, path="/workspace/src", depth=2)
    assert "deep/b.py" in {e["path"] for e in listed["entries"]}

    globbed = await call(session, "glob", sandbox_id=sandbox, root="/workspace", pattern="**/*.py")
    assert globbed["paths"] == ["src/deep/b.py"] and globbed["truncated"] is False

    found = await call(session, "grep", sandbox_id=sandbox, path="/workspace", pattern="five")
    assert found["matches"] == [{"path": "src/a.txt", "line": 5, "text": "five"}]
    found = await call(
        session,
        "grep",
        sandbox_id=sandbox,
        path="/workspace",
        pattern=r"LINE [0-9]+$",
        regex=True,
        glob="**/*.txt",
        limit=3,
    )
    assert len(found["matches"]) == 3 and found["truncated"] is True

    # Big answers are bounded (the Python client refuses events over 1 MiB): lines up to a
    # budget, then more_lines and the line to go on from.
    await call(
        session,
        "exec",
        sandbox_id=sandbox,
        command="for i in $(seq 1 3000); do printf '%05d%0195d\\n' $i 0; done > /workspace/big.txt",
    )
    got = await call(session, "read_file", sandbox_id=sandbox, path="/workspace/big.txt")
    lines = got["content"].splitlines()
    assert 100 < len(lines) < 2000 and got["more_lines"] is True and got["total_lines"] == 3000
    assert lines[-1].startswith(f"{got['end_line']:05d}")
    got = await call(
        session, "read_file", sandbox_id=sandbox, path="/workspace/big.txt", start_line=got["end_line"] + 1
    )
    assert got["content"].startswith(f"{got['start_line']:05d}")
    found = await call(session, "grep", sandbox_id=sandbox, path="/workspace/big.txt", pattern="0000", limit=5000)
    assert 100 < len(found["matches"]) < 3000 and found["truncated"] is True

    await call(session, "exec", sandbox_id=sandbox, command="head -c 100 /dev/zero > /workspace/bin")
    error = await fail(session, "read_file", sandbox_id=sandbox, path="/workspace/bin")
    assert error["code"] == "binary_file"
    error = await fail(session, "read_file", sandbox_id=sandbox, path="/workspace/nope")
    assert error["code"] == "not_found"


async def test_upload_and_download(session: ClientSession, sandbox: str, dirs: Dirs) -> None:
    case = dirs.allowed / uuid.uuid4().hex
    (case / "tree" / "sub").mkdir(parents=True)
    (case / "tree" / "sub" / "f.txt").write_text("in a tree\n")
    (case / "one.bin").write_bytes(bytes(range(256)) * 64)
    name = case.name

    up = await call(
        session, "upload", sandbox_id=sandbox, host_path=f"{name}/one.bin", sandbox_path="/workspace/in/one.bin"
    )
    assert up["bytes"] == 256 * 64 and up["kind"] == "file"
    up = await call(session, "upload", sandbox_id=sandbox, host_path=str(case / "tree"), sandbox_path="/workspace/tree")
    assert up["kind"] == "dir"
    out = await call(
        session, "exec", sandbox_id=sandbox, command="cat /workspace/tree/sub/f.txt; sha256sum < /workspace/in/one.bin"
    )
    assert out["output"].startswith("in a tree\n")

    down = await call(
        session, "download", sandbox_id=sandbox, sandbox_path="/workspace/in/one.bin", host_path=f"{name}/back.bin"
    )
    assert down["files"] == 1
    assert (case / "back.bin").read_bytes() == (case / "one.bin").read_bytes()
    down = await call(session, "download", sandbox_id=sandbox, sandbox_path="/workspace/tree", host_path=name)
    assert (case / "tree" / "sub" / "f.txt").read_text() == "in a tree\n"
    assert down["files"] >= 1
    down = await call(session, "download", sandbox_id=sandbox, sandbox_path="/workspace/tree", host_path=f"{name}/copy")
    assert (case / "copy" / "sub" / "f.txt").read_text() == "in a tree\n"
