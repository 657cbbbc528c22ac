"""deepagents on Tether: its own agent (``create_deep_agent``), driven by a scripted chat
model, runs execute, write, edit, read, grep and glob in a sandbox whose image has no python3;
the backend's direct calls match deepagents' contract; the provider is found through its entry
point."""

from __future__ import annotations

import asyncio
import importlib.metadata
from collections.abc import Iterator
from typing import Any

import pytest
from deepagents import create_deep_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage

from tether_sandbox import Sandbox
from tether_sandbox.integrations.deepagents import TetherProvider, TetherSandbox


class ScriptedModel(GenericFakeChatModel):
    """Answers with the scripted messages in order; tools bound are ignored."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def call(name: str, args: dict[str, Any], n: int) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{n}"}])


def test_the_agent_works_in_an_image_without_python3(busybox_sandbox: Sandbox) -> None:
    backend = TetherSandbox(busybox_sandbox)
    assert backend.execute("command -v python3 || echo none").output.strip() == "none"
    script: list[AIMessage] = [
        call("write_file", {"file_path": "/workspace/app/main.txt", "content": "alpha\nbeta\n"}, 1),
        call(
            "edit_file",
            {"file_path": "/workspace/app/main.txt", "old_string": "beta", "new_string": "gamma"},
            2,
        ),
        call("read_file", {"file_path": "/workspace/app/main.txt"}, 3),
        call("grep", {"pattern": "gamma", "path": "/workspace", "output_mode": "content"}, 4),
        call("glob", {"pattern": "*.txt", "path": "/workspace"}, 5),
        call("execute", {"command": "cat /workspace/app/main.txt; echo err >&2; exit 3"}, 6),
        call("ls", {"path": "/workspace/app"}, 7),
        AIMessage(content="done"),
    ]
    agent = create_deep_agent(model=ScriptedModel(messages=iter(script)), backend=backend)
    result = agent.invoke({"messages": [{"role": "user", "content": "go"}]})
    tools = {
        m.tool_call_id: str(m.content) for m in result["messages"] if isinstance(m, ToolMessage)
    }
    assert len(tools) == 7, tools
    assert "gamma" in tools["call-3"] and "alpha" in tools["call-3"]
    assert "/workspace/app/main.txt" in tools["call-4"] and "gamma" in tools["call-4"]
    assert "/workspace/app/main.txt" in tools["call-5"]
    assert "alpha\ngamma" in tools["call-6"] and "err" in tools["call-6"] and "3" in tools["call-6"]
    assert "/workspace/app/main.txt" in tools["call-7"]
    assert busybox_sandbox.files.read_text("/workspace/app/main.txt") == "alpha\ngamma\n"
    assert result["messages"][-1].content == "done"


def test_large_results_are_offloaded_on_a_read_only_root(sandbox: Sandbox) -> None:
    # The README's pattern: deepagents writes a large result under /large_tool_results and
    # hands the model a pointer; a local sandbox's root is read-only, so the backend keeps it
    # in a writable place and the model reads it back at the path it was given.
    backend = TetherSandbox(sandbox)
    script: list[AIMessage] = [
        call("execute", {"command": "seq 1 200000"}, 1),
        call("read_file", {"file_path": "/large_tool_results/call-1", "offset": 99999}, 2),
        call("grep", {"pattern": "199999", "path": "/large_tool_results"}, 3),
        AIMessage(content="done"),
    ]
    agent = create_deep_agent(model=ScriptedModel(messages=iter(script)), backend=backend)
    result = agent.invoke({"messages": [{"role": "user", "content": "count"}]})
    tools = {
        m.tool_call_id: str(m.content) for m in result["messages"] if isinstance(m, ToolMessage)
    }
    assert len(tools["call-1"]) < 100_000, f"{len(tools['call-1'])} characters in the context"
    assert "/large_tool_results/call-1" in tools["call-1"]
    assert "100000" in tools["call-2"] and "200000" not in tools["call-2"].split("\n")[0]
    assert "/large_tool_results/call-1" in tools["call-3"], tools["call-3"]
    kept = sandbox.files.read("/tmp/deepagents/large_tool_results/call-1")
    assert kept.split(b"\n")[:2] == [b"1", b"2"] and b"200000" in kept


def test_history_offload_paths_are_writable(sandbox: Sandbox) -> None:
    b = TetherSandbox(sandbox)
    assert b.write("/conversation_history/s-1.md", "## turn 1\n").error is None
    assert b.edit("/conversation_history/s-1.md", "turn 1", "turn one").occurrences == 1
    page = b.read("/conversation_history/s-1.md").file_data
    assert page is not None and page["content"] == "## turn one"
    assert [e["path"] for e in b.ls("/conversation_history").entries or []] == [
        "/conversation_history/s-1.md"
    ]
    assert [m["path"] for m in b.glob("*.md", "/conversation_history").matches or []] == [
        "/conversation_history/s-1.md"
    ]
    up = b.upload_files([("/blobs/abc", b"\x89PNG")])
    assert (up[0].path, up[0].error) == ("/blobs/abc", None)
    down = b.download_files(["/blobs/abc"])
    assert (down[0].path, down[0].content) == ("/blobs/abc", b"\x89PNG")
    assert sandbox.files.exists("/tmp/deepagents/conversation_history/s-1.md")
    # Turned off, the paths are the sandbox's own: its read-only root refuses the write.
    plain = TetherSandbox(sandbox, artifacts_dir=None)
    assert plain.write("/conversation_history/s-2.md", "x").error is not None


def test_backend_contract(busybox_sandbox: Sandbox) -> None:
    b = TetherSandbox(busybox_sandbox)
    assert b.id == busybox_sandbox.id
    # execute: combined output, exit codes, 124 on timeout
    r = b.execute("echo out; echo err >&2; exit 7")
    assert r.exit_code == 7 and "out" in r.output and "err" in r.output
    assert b.execute("sleep 5", timeout=1).exit_code == 124
    # write creates parents; read pages lines
    assert b.write("/workspace/d/e/f.txt", "".join(f"line{i}\n" for i in range(10))).error is None
    page = b.read("/workspace/d/e/f.txt", offset=2, limit=3)
    assert page.file_data is not None and page.file_data["content"] == "line2\nline3\nline4"
    assert (page.start_line, page.end_line, page.next_offset, page.total_lines) == (3, 5, 5, 10)
    assert b.read("/workspace/nope").error == "File '/workspace/nope': file_not_found"
    assert "exceeds file length" in (b.read("/workspace/d/e/f.txt", offset=50).error or "")
    empty = b.write("/workspace/empty", "")
    empty_read = b.read("/workspace/empty").file_data
    assert empty.error is None and empty_read and "empty contents" in empty_read["content"]
    # edit: unique, multiple, missing text, missing file, replace_all, CRLF files
    assert b.edit("/workspace/d/e/f.txt", "line1\n", "LINE1\n").occurrences == 1
    assert "multiple times" in (b.edit("/workspace/d/e/f.txt", "line", "x").error or "")
    assert "String not found" in (b.edit("/workspace/d/e/f.txt", "zzz", "x").error or "")
    assert "not found" in (b.edit("/workspace/none.txt", "a", "b").error or "")
    assert b.edit("/workspace/d/e/f.txt", "line", "L", replace_all=True).occurrences == 9
    busybox_sandbox.files.write("/workspace/crlf.txt", b"a\r\nb\r\n")
    assert b.edit("/workspace/crlf.txt", "a\nb", "c\nd").error is None
    assert busybox_sandbox.files.read("/workspace/crlf.txt") == b"c\r\nd\r\n"
    # grep: literal, with a basename glob at any depth, capped
    b.write("/workspace/src/x.py", "needle = 1\n")
    b.write("/workspace/src/deep/y.py", "a needle (literal.*)\n")
    b.write("/workspace/src/deep/z.md", "needle\n")
    g = b.grep("needle", "/workspace/src", glob="*.py")
    assert sorted(m["path"] for m in g.matches or []) == [
        "/workspace/src/deep/y.py",
        "/workspace/src/x.py",
    ]
    assert [m["text"] for m in b.grep("(literal.*)", "/workspace").matches or []] == [
        "a needle (literal.*)"
    ]
    capped = b.grep("needle", "/workspace/src", max_count=2)
    assert len(capped.matches or []) == 2 and capped.truncated
    # glob: files only, absolute, deepagents' basename and brace rules
    busybox_sandbox.files.write("/workspace/src/.hidden.py", "")
    paths = sorted(m["path"] for m in b.glob("*.py", "/workspace").matches or [])
    assert paths == ["/workspace/src/deep/y.py", "/workspace/src/x.py"]
    both = sorted(m["path"] for m in b.glob("src/**/*.{py,md}", "/workspace").matches or [])
    assert both == ["/workspace/src/deep/y.py", "/workspace/src/deep/z.md", "/workspace/src/x.py"]
    assert b.glob("src", "/workspace").matches == []  # directories never match
    # ls
    ls = b.ls("/workspace/src")
    assert {(e["path"], e["is_dir"]) for e in ls.entries or []} >= {
        ("/workspace/src/deep", True),
        ("/workspace/src/x.py", False),
    }
    assert "path_not_found" in (b.ls("/workspace/missing").error or "")
    # batches: per-file errors, parents created
    up = b.upload_files([("/workspace/up/a.bin", b"\x00\xff"), ("/workspace/src/x.py/bad", b"x")])
    assert up[0].error is None and up[1].error is not None
    down = b.download_files(["/workspace/up/a.bin", "/workspace/missing", "/workspace/src"])
    assert down[0].content == b"\x00\xff"
    assert (down[1].error, down[2].error) == ("file_not_found", "is_directory")
    # a relative path in a batch is refused in its place; the others still go through
    up = b.upload_files([("rel.txt", b"r"), ("/workspace/up/b.txt", b"b"), ("./c", b"c")])
    assert [r.error for r in up] == ["invalid_path", None, "invalid_path"]
    assert not busybox_sandbox.files.exists("/workspace/rel.txt")
    down = b.download_files(["up/b.txt", "/workspace/up/b.txt"])
    assert [(r.path, r.content, r.error) for r in down] == [
        ("up/b.txt", None, "invalid_path"),
        ("/workspace/up/b.txt", b"b", None),
    ]
    assert b.upload_files([]) == [] and b.download_files([]) == []
    # delete
    assert b.delete("/workspace/src").error is None and not busybox_sandbox.files.exists(
        "/workspace/src"
    )
    assert "not found" in (b.delete("/workspace/src").error or "")


def test_async_twins_run_concurrently(busybox_sandbox: Sandbox) -> None:
    b = TetherSandbox(busybox_sandbox)

    async def main() -> None:
        await b.awrite("/workspace/a.txt", "one\n")
        results = await asyncio.gather(*(b.aexecute(f"echo {i}") for i in range(20)))
        assert [r.output.strip() for r in results] == [str(i) for i in range(20)]
        edited = await b.aedit("/workspace/a.txt", "one", "two")
        assert edited.occurrences == 1
        read = await b.aread("/workspace/a.txt")
        assert read.file_data is not None and read.file_data["content"] == "two"
        assert [m["path"] for m in (await b.aglob("*.txt", "/workspace")).matches or []] == [
            "/workspace/a.txt"
        ]
        assert (await b.agrep("two", "/workspace")).matches
        assert (await b.als("/workspace")).entries
        assert (await b.adownload_files(["/workspace/a.txt"]))[0].content == b"two\n"

    asyncio.run(main())


@pytest.fixture
def provider(relay: object) -> Iterator[TetherProvider]:
    yield TetherProvider(ttl=600)


def test_provider_through_its_entry_point(provider: TetherProvider) -> None:
    eps = importlib.metadata.entry_points(group="deepagents_code.sandbox_providers")
    ep = {e.name: e for e in eps}["tether"]
    assert ep.load() is TetherProvider
    made = ep.load()()
    first = made.get_or_create(thread_id="t-1")
    try:
        again = made.get_or_create(thread_id="t-1")
        assert again.id == first.id
        same = provider.get_or_create(sandbox_id=first.id)
        assert same.execute("echo hi").output == "hi\n"
        with pytest.raises(Exception, match="no Tether sandbox"):
            provider.get_or_create(sandbox_id="sb-does-not-exist")
    finally:
        provider.delete(sandbox_id=first.id)
    provider.delete(sandbox_id=first.id)  # idempotent
    assert not Sandbox.list(labels={"thread_id": "t-1"})

    async def main() -> None:
        sb = await provider.aget_or_create()
        assert (await sb.aexecute("echo async")).output == "async\n"
        await provider.adelete(sandbox_id=sb.id)

    asyncio.run(main())


def test_provider_lists_sandboxes(provider: TetherProvider) -> None:
    first = provider.get_or_create(thread_id="list-1")
    second = provider.get_or_create(thread_id="list-2")
    try:
        listed = provider.list()
        assert listed["cursor"] is None
        by_id = {item["sandbox_id"]: item for item in listed["items"]}
        assert {first.id, second.id} <= set(by_id)
        meta = by_id[first.id]["metadata"]
        assert meta["state"] == "running" and meta["labels"]["thread_id"] == "list-1"
        only = provider.list(thread_id="list-2")
        assert [i["sandbox_id"] for i in only["items"]] == [second.id]

        async def main() -> None:
            again = await provider.alist(labels={"thread_id": "list-1"}, cursor=None)
            assert [i["sandbox_id"] for i in again["items"]] == [first.id]

        asyncio.run(main())
    finally:
        provider.delete(sandbox_id=first.id)
        provider.delete(sandbox_id=second.id)
    assert provider.list(thread_id="list-1")["items"] == []


def test_a_threads_paused_sandbox_resumes_when_the_thread_comes_back(
    provider: TetherProvider,
) -> None:
    first = provider.get_or_create(thread_id="paused-1")
    try:
        first.write("/workspace/kept.txt", "kept")
        with Sandbox.connect(first.id) as sb:
            sb.pause()
        # The thread comes back: get-or-create by its label finds the paused sandbox, and
        # the first call opens a session, which resumes it where it was.
        again = provider.get_or_create(thread_id="paused-1")
        assert again.id == first.id
        assert again.execute("cat /workspace/kept.txt").output == "kept"
        with Sandbox.connect(first.id) as sb:
            assert sb.info.state == "running"
            sb.pause()
        by_id = provider.get_or_create(sandbox_id=first.id)
        assert by_id.execute("echo by-id").output == "by-id\n"
    finally:
        provider.delete(sandbox_id=first.id)
