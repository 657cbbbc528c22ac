"""Dynamiq on Tether: a Dynamiq ``Agent`` with ``TetherSandbox`` attached, driven by a scripted
LLM, runs the shell, file-write, file-read and sandbox-info tools; the preview URL it reports
serves what the agent started; the backend creates lazily, reconnects by id, retries rate
limits and keeps the input/ and output/ conventions."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import litellm
import pytest
from dynamiq.connections import OpenAI as OpenAIConnection
from dynamiq.nodes.agents import Agent
from dynamiq.nodes.llms import OpenAI
from dynamiq.nodes.tools.code_interpreter import SandboxCreationErrorHandling
from dynamiq.sandboxes import SandboxConfig
from dynamiq.sandboxes.exceptions import SandboxConnectionError

from preview_clients import fetch
from tether_sandbox import Sandbox, errors
from tether_sandbox.integrations.dynamiq import TetherSandbox

SERVER = "mkdir -p site && echo from-dynamiq > site/index.html && exec python3 -m http.server 8000 --directory site"


def scripted_llm(script: list[str], prompts: list[str]) -> OpenAI:
    """A Dynamiq LLM node whose completions are the scripted texts; it records each prompt's
    last message (the previous tool's observation)."""

    def completion(**kwargs: Any) -> litellm.ModelResponse:
        prompts.append(str(kwargs["messages"][-1]["content"]))
        text = script.pop(0)
        return litellm.ModelResponse(
            choices=[
                {
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "index": 0,
                }
            ],
            usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        )

    llm = OpenAI(connection=OpenAIConnection(api_key="unused"), model="gpt-4o")
    llm._completion = completion
    return llm


def act(tool: str, args: dict[str, Any]) -> str:
    return f"Thought: next step\nAction: {tool}\nAction Input: {json.dumps(args)}"


@pytest.fixture
def backend(relay: object) -> Iterator[TetherSandbox]:
    sb = TetherSandbox(timeout=600, labels={"test": "dynamiq"})
    try:
        yield sb
    finally:
        sb.close(kill=True)


def test_a_dynamiq_agent_uses_the_sandbox(backend: TetherSandbox) -> None:
    assert backend.sandbox_id is None  # nothing is created before the first use
    prompts: list[str] = []
    script = [
        act("sandbox-shell", {"command": "echo hi; pwd; ls -d input output"}),
        act(
            "file-write",
            {"file_path": "/workspace/output/report.md", "content": "# Report\nall good\n"},
        ),
        act("sandbox-shell", {"command": SERVER, "run_in_background_enabled": True}),
        act(
            "sandbox-shell",
            {
                "command": "for i in $(seq 100); do grep -q ':1F40 ' /proc/net/tcp* && break; sleep 0.1; done; echo waited"
            },
        ),
        act("sandbox-info", {"port": 8000}),
        act("file-read", {"file_path": "/workspace/output/report.md"}),
        "Thought: done\nAnswer: finished",
    ]
    agent = Agent(
        name="sandbox-agent",
        llm=scripted_llm(script, prompts),
        sandbox=SandboxConfig(enabled=True, backend=backend),
        role="test",
        max_loops=10,
    )
    result = agent.run(input_data={"input": "go"})
    assert result.status.value == "success", result.error
    assert result.output["content"] == "finished"
    shell, wrote, _background, waited, info, read = prompts[1:7]
    assert "all good" in read
    assert "hi" in shell and "/workspace" in shell and "input" in shell and "output" in shell
    assert backend.retrieve("/workspace/output/report.md") == b"# Report\nall good\n", wrote
    assert "waited" in waited
    url = info[info.index("http") :].split()[0].strip("\"',")
    assert fetch(url) == "from-dynamiq\n", info
    assert backend.list_files("/workspace/output") == ["/workspace/output/report.md"]
    files = backend.collect_files("/workspace/output")
    assert [f.name for f in files] == ["report.md"]


def test_large_tool_outputs_are_stored_in_the_sandbox(backend: TetherSandbox) -> None:
    # Dynamiq's agent stores a tool's large output under /home/user/.tools (its default) and
    # shows the model a preview and the path; on a read-only root that store failed and the
    # whole output went inline.
    from dynamiq.sandboxes.tools.shell import SandboxShellTool

    prompts: list[str] = []
    script = [act("big-shell", {"command": "seq 1 20000"}), "Thought: done\nAnswer: counted"]
    big = SandboxShellTool(
        name="big-shell", sandbox=backend, is_output_persisted_in_sandbox_allowed=True
    )
    agent = Agent(
        name="sandbox-agent",
        llm=scripted_llm(script, prompts),
        sandbox=SandboxConfig(enabled=True, backend=backend),
        tools=[big],
        role="test",
        max_loops=4,
    )
    result = agent.run(input_data={"input": "count"})
    assert result.status.value == "success", result.error
    observation = prompts[1]
    assert "Tool output saved to: /home/user/.tools/" in observation, observation[:300]
    path = observation.split("Tool output saved to: ", 1)[1].split()[0]
    stored = backend.retrieve(path).decode()
    preview = observation.split("Tool output preview:", 1)[1]
    assert stored.endswith("19999\n20000\n") and "\n20000" not in preview
    real = "/workspace" + path.removeprefix("/home/user")
    assert backend.run_command_shell(f"grep -x 19999 {real}").stdout == "19999\n"
    assert any(p.startswith("/workspace/.tools/") for p in backend.list_files("/home/user/.tools"))


def test_backend_contract(backend: TetherSandbox) -> None:
    r = backend.run_command_shell("echo out; echo err >&2; exit 4")
    assert (r.stdout, r.stderr, r.exit_code, r.is_success) == ("out\n", "err\n", 4, False)
    slow = backend.run_command_shell("sleep 5", timeout=1)
    assert slow.exit_code == 124 and slow.error and "timed out" in slow.error
    assert (
        backend.upload_file("data.csv", b"a,b\n", destination_path="input/data.csv")
        == "/workspace/input/data.csv"
    )
    assert backend.upload_file("plain.txt", b"x") == "/workspace/plain.txt"
    assert backend.exists("input/data.csv") and not backend.exists("input/none.csv")
    assert backend.retrieve("/workspace/input/data.csv") == b"a,b\n"
    with pytest.raises(FileNotFoundError):
        backend.retrieve("missing.txt")
    assert backend.delete_file("plain.txt") and not backend.exists("plain.txt")
    assert backend.list_files("/nowhere") == []
    stored = backend.store("output/x.txt", io.BytesIO(b"via store"))
    assert (
        stored.path == "/workspace/output/x.txt" and backend.retrieve(stored.path) == b"via store"
    )
    info = backend.get_sandbox_info()
    assert info.sandbox_id == backend.sandbox_id and info.public_url is None
    assert "token" not in json.dumps(backend.connection.to_dict())


def test_reconnect_by_id_and_close(backend: TetherSandbox) -> None:
    sandbox_id = backend.ensure_started()
    assert sandbox_id is not None
    backend.upload_file("keep.txt", b"kept")
    backend.close()  # disconnects; the sandbox lives on
    again = TetherSandbox(sandbox_id=sandbox_id)
    assert again.retrieve("keep.txt") == b"kept"
    view = again.create_view("/workspace/view")
    assert (
        view.sandbox_id == sandbox_id and view.upload_file("v.txt", b"v") == "/workspace/view/v.txt"
    )
    again.close(kill=True)
    assert again.sandbox_id is None
    with pytest.raises(errors.SandboxNotFound):
        Sandbox.connect(sandbox_id)
    gone = TetherSandbox(
        sandbox_id=sandbox_id, creation_error_handling=SandboxCreationErrorHandling(max_retries=1)
    )
    with pytest.raises(SandboxConnectionError, match="Tether"):
        gone.ensure_started()


def test_creation_retries_rate_limits(
    backend: TetherSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Sandbox.create
    calls: list[int] = []

    def limited(*args: Any, **kwargs: Any) -> Sandbox:
        calls.append(1)
        if len(calls) < 3:
            raise errors.RateLimited("slow down", status=429, code="rate_limited")
        return real(*args, **kwargs)

    monkeypatch.setattr(Sandbox, "create", limited)
    backend.creation_error_handling = SandboxCreationErrorHandling(
        max_retries=5, initial_wait_seconds=0.01, max_wait_seconds=0.05, jitter=0
    )
    assert backend.ensure_started() and len(calls) == 3


def test_reconnect_by_id_resumes_a_paused_sandbox(backend: TetherSandbox) -> None:
    sandbox_id = backend.ensure_started()
    assert sandbox_id is not None
    backend.upload_file("keep.txt", b"kept")
    backend.close()
    with Sandbox.connect(sandbox_id) as sb:
        sb.pause()
    again = TetherSandbox(sandbox_id=sandbox_id)
    try:
        # Its first call opens a session, which resumes the sandbox where it was.
        assert again.retrieve("keep.txt") == b"kept"
        assert again.run_command_shell("echo resumed").stdout == "resumed\n"
        assert Sandbox.connect(sandbox_id).info.state == "running"
    finally:
        again.close(kill=True)
