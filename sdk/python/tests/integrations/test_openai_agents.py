"""The OpenAI Agents SDK on Tether: its sandbox session (wrapped by the SDK's own
``SandboxSession``) runs exec, file reads and writes, a workspace round trip as tar into a new
sandbox, a PTY, an exposed port, and resumes from serialized state."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents import Model, ModelResponse, RunConfig, Runner, Usage
from agents.run_config import SandboxRunConfig
from agents.sandbox import SandboxAgent
from agents.sandbox.errors import WorkspaceArchiveWriteError, WorkspaceReadNotFoundError
from agents.sandbox.manifest import Manifest
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from preview_clients import fetch
from tether_sandbox import Sandbox, errors
from tether_sandbox.integrations.openai_agents import (
    TetherSandboxClient,
    TetherSandboxClientOptions,
    TetherSandboxSessionState,
)

SERVER = "cd /tmp && echo from-agents > index.html && exec python3 -m http.server 8000"


async def test_exec_files_and_a_workspace_round_trip(relay: object) -> None:
    client = TetherSandboxClient()
    options = TetherSandboxClientOptions(
        labels={"test": "openai-agents"}, ttl=600, envs={"GREETING": "hello"}
    )
    session = await client.create(manifest=Manifest(), options=options)
    async with session:
        r = await session.exec("echo $GREETING from $(pwd); echo oops >&2; exit 3")
        assert (r.stdout, r.stderr, r.exit_code) == (b"hello from /workspace\n", b"oops\n", 3)
        await session.write(Path("src/app.py"), io.BytesIO(b"print('hi')\n"))
        assert (await session.read(Path("/workspace/src/app.py"))).read() == b"print('hi')\n"
        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read(Path("missing.txt"))
        await session.write(Path("bin.dat"), io.BytesIO(bytes(range(256))))
        archive = (await session.persist_workspace()).read()
        names = tarfile.open(fileobj=io.BytesIO(archive)).getnames()
        assert any(n.endswith("src/app.py") for n in names) and any(
            n.endswith("bin.dat") for n in names
        )
        first_id = session._inner.state.sandbox_id  # type: ignore[attr-defined]

    # The sandbox went with the session; the archive brings the workspace into a new one.
    with pytest.raises(errors.SandboxNotFound):
        Sandbox.connect(first_id)
    second = await client.create(manifest=Manifest(), options=options)
    async with second:
        await second.hydrate_workspace(io.BytesIO(archive))
        assert (await second.read(Path("bin.dat"))).read() == bytes(range(256))
        ran = await second.exec("cat src/app.py")
        assert ran.stdout == b"print('hi')\n"


async def test_hydrate_refuses_archives_that_escape(relay: object) -> None:
    client = TetherSandboxClient()
    session = await client.create(options=TetherSandboxClientOptions(ttl=600))
    async with session:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("../../etc/evil")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        with pytest.raises(WorkspaceArchiveWriteError):
            await session.hydrate_workspace(io.BytesIO(buf.getvalue()))
        assert (await session.exec("test -e /etc/evil")).exit_code == 1


async def test_pty_and_exposed_ports(relay: object) -> None:
    client = TetherSandboxClient()
    session = await client.create(
        options=TetherSandboxClientOptions(ttl=600, exposed_ports=(8000,))
    )
    async with session:
        term = await session.pty_exec_start("sh", tty=True, yield_time_s=1)
        assert term.process_id is not None
        update = await session.pty_write_stdin(
            session_id=term.process_id, chars="echo $((6*7))\n", yield_time_s=2
        )
        assert b"42" in update.output
        done = await session.pty_write_stdin(
            session_id=term.process_id, chars="exit 5\n", yield_time_s=5
        )
        assert done.exit_code == 5 and done.process_id is None
        piped = await session.pty_exec_start("echo piped; exit 2", yield_time_s=5)
        assert piped.output == b"piped\n" and piped.exit_code == 2

        server = await session.pty_exec_start(SERVER, yield_time_s=0.1)
        assert server.process_id is not None
        for _ in range(100):
            if (await session.exec("grep -q ':1F40 ' /proc/net/tcp*")).exit_code == 0:
                break
            await asyncio.sleep(0.1)
        endpoint = await session.resolve_exposed_port(8000)
        url = f"{endpoint.url_for('http')}"
        assert await asyncio.to_thread(fetch, url) == "from-agents\n"


async def test_resume_from_serialized_state(relay: object) -> None:
    client = TetherSandboxClient()
    options = TetherSandboxClientOptions(ttl=600, delete_on_shutdown=False)
    session = await client.create(options=options)
    await session.start()
    await session.write(Path("kept.txt"), io.BytesIO(b"kept"))
    payload = client.serialize_session_state(session._inner.state)
    assert "token" not in str(payload)
    await session.aclose()

    resumed = await client.resume(client.deserialize_session_state(payload))
    async with resumed:
        assert (await resumed.read(Path("kept.txt"))).read() == b"kept"
    await client.delete(resumed)
    with pytest.raises(errors.SandboxNotFound):
        Sandbox.connect(str(payload["sandbox_id"]))


async def test_the_documented_cleanup_after_the_session_closes(relay: object) -> None:
    # The Agents SDK's documented pattern, and what its runtime does for a session it owns:
    # the session shuts down (here deleting its sandbox), then client.delete(session).
    client = TetherSandboxClient()
    session = await client.create(options=TetherSandboxClientOptions(ttl=600))
    async with session:
        assert (await session.exec("echo hi")).stdout == b"hi\n"
    sandbox_id = session._inner.state.sandbox_id  # type: ignore[attr-defined]
    await client.delete(session)
    await client.delete(session)  # and again: deleting is idempotent
    kept = await client.create(
        options=TetherSandboxClientOptions(ttl=600, delete_on_shutdown=False)
    )
    async with kept:
        await kept.exec("true")
    kept_id = kept._inner.state.sandbox_id  # type: ignore[attr-defined]
    with Sandbox.connect(kept_id) as probe:
        assert probe.info.state == "running"
    await client.delete(kept)
    for gone in (sandbox_id, kept_id):
        with pytest.raises(errors.SandboxNotFound):
            Sandbox.connect(gone)


async def test_a_run_that_owns_its_session_cleans_up(
    relay: object, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a client and options instead of a session, the runtime creates the session,
    # runs, then shuts it down and calls client.delete(session) itself; a failing cleanup
    # is logged, not raised.
    caplog.set_level(logging.WARNING)
    model = ScriptedModel([("exec_command", {"cmd": "echo owned"})], final="done")
    agent = SandboxAgent(name="coder", instructions="use the sandbox", model=model)
    labels = {"test": "openai-agents-owned"}
    result = await Runner.run(
        agent,
        "go",
        run_config=RunConfig(
            sandbox=SandboxRunConfig(
                client=TetherSandboxClient(),
                options=TetherSandboxClientOptions(ttl=600, labels=labels),
            ),
            tracing_disabled=True,
        ),
    )
    assert result.final_output == "done" and "owned" in model.seen[0]
    assert Sandbox.list(labels=labels) == []
    failures = [r.getMessage() for r in caplog.records if "clean up" in r.getMessage()]
    assert failures == []


class ScriptedModel(Model):
    """An Agents SDK model that answers with scripted tool calls, then a final text; it
    records the tool outputs it was sent."""

    def __init__(self, calls: list[tuple[str, dict[str, Any]]], final: str) -> None:
        self.calls, self.final = list(calls), final
        self.seen: list[str] = []

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        items = args[1] if len(args) > 1 else kwargs["input"]
        if isinstance(items, list) and items:
            last = items[-1]
            if isinstance(last, dict) and last.get("type") == "function_call_output":
                self.seen.append(str(last.get("output")))
        if self.calls:
            name, arguments = self.calls.pop(0)
            n = len(self.calls)
            item: Any = ResponseFunctionToolCall(
                arguments=json.dumps(arguments),
                call_id=f"call-{n}",
                name=name,
                type="function_call",
                id=f"fc-{n}",
                status="completed",
            )
        else:
            item = ResponseOutputMessage(
                id="msg-final",
                content=[ResponseOutputText(text=self.final, type="output_text", annotations=[])],
                role="assistant",
                status="completed",
                type="message",
            )
        return ModelResponse(output=[item], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tests run without streaming")


async def test_a_sandbox_agent_runs_commands(relay: object) -> None:
    client = TetherSandboxClient()
    session = await client.create(options=TetherSandboxClientOptions(ttl=600))
    model = ScriptedModel(
        [
            ("exec_command", {"cmd": "echo from-the-agent > note.txt && cat note.txt"}),
            ("exec_command", {"cmd": "ls; exit 4"}),
        ],
        final="done",
    )
    agent = SandboxAgent(name="coder", instructions="use the sandbox", model=model)
    async with session:
        result = await Runner.run(
            agent,
            "go",
            run_config=RunConfig(sandbox=SandboxRunConfig(session=session), tracing_disabled=True),
        )
        assert result.final_output == "done"
        assert "from-the-agent" in model.seen[0], model.seen
        assert "note.txt" in model.seen[1] and "4" in model.seen[1], model.seen
        assert (await session.read(Path("note.txt"))).read() == b"from-the-agent\n"


async def test_pause_on_exit_keeps_the_sandbox_paused_for_resume(relay: object) -> None:
    client = TetherSandboxClient()
    session = await client.create(options=TetherSandboxClientOptions(ttl=600, pause_on_exit=True))
    async with session:
        await session.write(Path("kept.txt"), io.BytesIO(b"kept"))
    state = session._inner.state
    assert isinstance(state, TetherSandboxSessionState)
    # Shut down paused, not deleted; and client.delete(session) leaves it, as on E2B.
    await client.delete(session)
    with Sandbox.connect(state.sandbox_id) as probe:
        assert probe.info.state == "paused"
    payload = client.serialize_session_state(state)

    resumed = await client.resume(client.deserialize_session_state(payload))
    assert resumed._inner.state.sandbox_id == state.sandbox_id  # type: ignore[attr-defined]
    async with resumed:
        assert await resumed.running()
        assert (await resumed.read(Path("kept.txt"))).read() == b"kept"
        assert (await resumed.exec("echo on")).stdout == b"on\n"
    with Sandbox.connect(state.sandbox_id) as probe:
        assert probe.info.state == "paused"
        probe.delete()
