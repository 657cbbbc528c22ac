"""Agno on Tether: an Agno ``Agent`` with ``TetherTools``, driven by a scripted model, runs
shell, file, stateful Python and preview-URL tools in local sandboxes; background jobs go
through their statuses; the manager runs code in several sandboxes at once."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from agno.agent import Agent
from agno.models.base import Model
from agno.models.response import ModelResponse

from preview_clients import fetch
from tether_sandbox import Sandbox, errors
from tether_sandbox.integrations.agno import E2BToolkit, SandboxManager, TetherTools

JOB_WAIT_S = 30.0
# ./check installs matplotlib where local sandboxes' python3 finds it through PYTHONPATH.
SITE = {"PYTHONPATH": os.environ.get("TETHER_TEST_SANDBOX_SITE", "")}


@dataclass
class ScriptedModel(Model):
    """An Agno model that answers with scripted tool calls, one turn each, then text."""

    id: str = "scripted"
    name: str = "scripted"
    provider: str = "test"
    script: list[tuple[str, dict[str, Any]] | str] = field(default_factory=list)

    def _next(self) -> ModelResponse:
        step = self.script.pop(0)
        if isinstance(step, str):
            return ModelResponse(role="assistant", content=step)
        name, args = step
        call = {
            "id": f"call-{len(self.script)}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        return ModelResponse(role="assistant", content="", tool_calls=[call])

    def invoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return self._next()

    async def ainvoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return self._next()

    def invoke_stream(self, *args: Any, **kwargs: Any) -> Iterator[ModelResponse]:
        yield self._next()

    async def ainvoke_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ModelResponse]:
        yield self._next()

    def _parse_provider_response(self, response: Any, **kwargs: Any) -> ModelResponse:
        return response  # type: ignore[no-any-return]

    def _parse_provider_response_delta(self, response: Any) -> ModelResponse:
        return response  # type: ignore[no-any-return]


@pytest.fixture
def tools(relay: object, tmp_path: Path) -> Iterator[TetherTools]:
    t = TetherTools(SandboxManager(default_timeout=600), local_dir=tmp_path, python_env=SITE)
    try:
        yield t
    finally:
        t.manager.shutdown_all()


def tool_results(run: Any) -> list[Any]:
    out = []
    for m in run.messages:
        if m.role == "tool":
            text = m.content if isinstance(m.content, str) else str(m.content)
            out.append(json.loads(text))
    return out


def test_an_agno_agent_uses_the_sandbox(tools: TetherTools) -> None:
    server = "cd /tmp && echo served-by-tether > index.html && exec python3 -m http.server 8000"
    model = ScriptedModel(
        script=[
            ("create_sandbox", {"metadata": {"purpose": "test"}}),
            ("run_command", {"command": "echo hi; echo oops >&2; exit 3"}),
            ("write_file_content", {"file_path": "/workspace/notes.txt", "content": "hello"}),
            ("read_file_content", {"file_path": "/workspace/notes.txt"}),
            ("run_python_code", {"code": "x = 21"}),
            ("run_python_code", {"code": "x * 2"}),
            ("run_python_code", {"code": "1/0"}),
            ("run_server", {"command": server, "port": 8000}),
            ("get_public_url", {"port": 8000}),
            ("list_files", {"directory_path": "/workspace"}),
            "all done",
        ]
    )
    agent = Agent(model=model, tools=[tools])
    run = agent.run("use the sandbox")
    assert run.content == "all done"
    (created, cmd, wrote, read, set_x, get_x, boom, server_up, url, listing) = tool_results(run)
    assert created["status"] == "success" and created["metadata"] == {"purpose": "test"}
    assert cmd["output"] == {"stdout": "hi\n", "stderr": "oops\n", "exit_code": 3}
    assert wrote["bytes"] == 5 and read["content"] == "hello"
    assert set_x["status"] == "success" and get_x["results"] == ["42"]
    assert boom["status"] == "error" and "ZeroDivisionError" in boom["message"]
    assert server_up["status"] == "success", server_up
    assert fetch(server_up["url"]) == "served-by-tether\n"
    assert fetch(url["url"]) == "served-by-tether\n"
    assert {"name": "notes.txt", "type": "file", "size": 5} in listing["entries"]


def wait_status(tools: TetherTools, job_id: str, wanted: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + JOB_WAIT_S
    while True:
        status: dict[str, Any] = json.loads(tools.get_job_status(job_id))
        if status["status"] in wanted or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def test_background_jobs_and_their_statuses(tools: TetherTools) -> None:
    tools.create_sandbox()
    done = json.loads(tools.run_command_background("echo finished"))
    assert wait_status(tools, done["job_id"], {"done"})["result"]["stdout"] == "finished\n"
    failed = json.loads(tools.run_python_code_background("raise SystemExit(5)"))
    assert wait_status(tools, failed["job_id"], {"done"})["result"]["exit_code"] == 5
    long = json.loads(tools.run_command_background("echo started; exec sleep 300"))
    assert wait_status(tools, long["job_id"], {"running"})["status"] == "running"
    assert json.loads(tools.kill_job(long["job_id"]))["status"] == "cancelled"
    assert json.loads(tools.get_job_status(long["job_id"]))["status"] == "cancelled"
    assert json.loads(tools.get_job_status("job-nope"))["status"] == "error"
    jobs = json.loads(tools.list_jobs())["jobs"]
    assert [j["status"] for j in jobs] == ["done", "done", "cancelled"]


def test_jobs_wait_pending_behind_the_pool(relay: object, tmp_path: Path) -> None:
    tools = TetherTools(SandboxManager(default_timeout=600), max_workers=1, local_dir=tmp_path)
    try:
        tools.create_sandbox()
        first = json.loads(tools.run_command_background("exec sleep 300"))
        second = json.loads(tools.run_command_background("echo second"))
        assert wait_status(tools, first["job_id"], {"running"})["status"] == "running"
        assert json.loads(tools.get_job_status(second["job_id"]))["status"] == "pending"
        assert json.loads(tools.kill_job(second["job_id"]))["status"] == "cancelled"
        tools.kill_job(first["job_id"])
    finally:
        tools.manager.shutdown_all()


def test_files_stay_in_the_local_dir(tools: TetherTools, tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    up = json.loads(tools.upload_file("data.csv", sandbox_path="/workspace/in/data.csv"))
    assert up["status"] == "success"
    down = json.loads(
        tools.download_file_from_sandbox("/workspace/in/data.csv", local_path="out/copy.csv")
    )
    assert (tmp_path / "out" / "copy.csv").read_text() == "a,b\n1,2\n", down
    escape = json.loads(
        tools.download_file_from_sandbox("/workspace/in/data.csv", local_path="../../etc/x")
    )
    assert escape["status"] == "error" and "outside" in escape["message"]
    assert json.loads(tools.upload_file("/etc/passwd"))["status"] == "error"
    plot = "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt; plt.plot([1, 2]); plt.show()"
    ran = json.loads(tools.run_python_code(plot))
    if ran["status"] == "error" and "matplotlib" in ran["message"]:
        pytest.fail("matplotlib is missing in the sandbox: run ./check, which installs it")
    assert ran["images"] == 1, ran
    png = json.loads(tools.download_png_result(0, output_path="fig.png"))
    assert (tmp_path / "fig.png").read_bytes().startswith(b"\x89PNG"), png


def test_the_manager_runs_code_in_all_sandboxes(tools: TetherTools) -> None:
    ids = [json.loads(tools.create_sandbox(metadata={"n": str(i)}))["sandbox_id"] for i in range(3)]
    results = json.loads(tools.run_in_all_sandboxes("import os; print(os.uname().nodename)"))[
        "results"
    ]
    assert set(results) == set(ids)
    assert all(r["status"] == "success" and r["stdout"] for r in results.values())
    running = json.loads(tools.list_running_sandboxes())["sandboxes"]
    assert set(ids) <= {s["sandbox_id"] for s in running}
    assert json.loads(tools.shutdown_sandbox(ids[0]))["status"] == "success"
    assert [
        s["sandbox_id"] for s in json.loads(tools.list_managed_sandboxes())["sandboxes"]
    ] == ids[1:]
    done = json.loads(tools.shutdown_all_sandboxes())["results"]
    assert set(done) == set(ids[1:])
    assert json.loads(tools.list_managed_sandboxes())["sandboxes"] == []


def test_the_e2b_toolkit_pages_program(relay: object, tmp_path: Path) -> None:
    """The page's names and calls, unchanged: ``SandboxManager(api_key=None, ...)``,
    ``E2BToolkit(manager, auto_create_default=False)``, chart data, ``force_shutdown_all``."""
    manager = SandboxManager(api_key=None, default_timeout=360)
    toolkit = E2BToolkit(manager, auto_create_default=False, local_dir=tmp_path, python_env=SITE)
    assert isinstance(toolkit, TetherTools)
    outsider = Sandbox.create(labels={"test": "agno-outsider"}, ttl=600)
    chart = (
        "import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [4, 5, 6], label='sales'); plt.title('Q1')\n"
        "plt.xlabel('month'); plt.ylabel('units'); plt.show()"
    )
    model = ScriptedModel(
        script=[
            ("create_sandbox", {"timeout": 300, "metadata": {"purpose": "data-analysis"}}),
            ("run_python_code", {"code": chart}),
            ("download_chart_data", {"result_index": 0, "output_path": "chart-data.json"}),
            ("force_shutdown_all", {}),
            "cleaned up",
        ]
    )
    run = Agent(model=model, tools=[toolkit]).run("chart it, then clean up")
    created, ran, data, shut = tool_results(run)
    assert created["status"] == "success", created
    assert ran["status"] == "success" and ran["images"] == 1, ran
    assert data["status"] == "success" and data["chart_path"] == str(tmp_path / "chart-data.json")
    saved = json.loads((tmp_path / "chart-data.json").read_text())
    assert (saved["type"], saved["title"], saved["x_label"], saved["y_label"]) == (
        "line",
        "Q1",
        "month",
        "units",
    )
    assert saved["elements"] == [{"label": "sales", "points": [[1, 4], [2, 5], [3, 6]]}]
    assert (tmp_path / "chart-data.png").read_bytes().startswith(b"\x89PNG")
    assert shut["status"] == "success" and {created["sandbox_id"], outsider.id} <= set(
        shut["results"]
    )
    with pytest.raises(errors.SandboxNotFound):
        Sandbox.connect(outsider.id)


def test_the_api_key_is_ignored_and_tools_never_raise(relay: object, tmp_path: Path) -> None:
    # An E2B key is not the relay's token: passing it must not break the sandbox.
    tools = E2BToolkit(
        SandboxManager(api_key="e2b_not_a_tether_token", default_timeout=600), local_dir=tmp_path
    )
    try:
        assert json.loads(tools.run_command("echo ok"))["output"]["stdout"] == "ok\n"
        # Arguments a model gets wrong, and sandboxes that are not there, are error statuses.
        failures = [
            tools.set_sandbox_timeout("soon"),  # type: ignore[arg-type]
            tools.watch_directory("/workspace", duration_seconds="long"),  # type: ignore[arg-type]
            tools.run_server("true", port=8000, sandbox_id="sb-not-managed"),
            tools.run_python_code("1", timeout="never"),  # type: ignore[arg-type]
            tools.download_chart_data(result_index=0, sandbox_id="sb-not-managed"),
        ]
        for raw in failures:
            assert json.loads(raw)["status"] == "error", raw
    finally:
        tools.manager.shutdown_all()
    down = E2BToolkit(SandboxManager(relay="http://127.0.0.1:9"), local_dir=tmp_path)
    assert json.loads(down.run_command("echo unreachable"))["status"] == "error"
    assert json.loads(down.force_shutdown_all())["status"] == "error"


def test_connecting_to_a_paused_sandbox_resumes_it(tools: TetherTools) -> None:
    created = json.loads(tools.create_sandbox())
    sandbox_id = created["sandbox_id"]
    tools.write_file_content("/workspace/kept.txt", "kept")
    with Sandbox.connect(sandbox_id) as sb:
        sb.pause()
    # Another toolkit, as a later run would make, connects to it by id and reports it paused.
    later = TetherTools(SandboxManager(default_timeout=600), local_dir=tools.local_dir)
    assert json.loads(later.connect_sandbox(sandbox_id))["status"] == "success"
    assert json.loads(later.get_sandbox_status(sandbox_id))["state"] == "paused"
    # Its first command opens a session, which resumes the sandbox where it was.
    ran = json.loads(later.run_command("cat /workspace/kept.txt", sandbox_id=sandbox_id))
    assert ran["status"] == "success" and ran["output"]["stdout"] == "kept"
    assert json.loads(later.get_sandbox_status(sandbox_id))["state"] == "running"
