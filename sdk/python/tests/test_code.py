"""Code: one-shot run_code in python, node and bash, and the stateful Python session."""

from __future__ import annotations

import os
import shutil

import pytest

from tether_sandbox import AsyncSandbox, CommandTimeout, Sandbox


def test_run_code_python_and_bash(sandbox: Sandbox) -> None:
    assert sandbox.run_code("print(6 * 7)").stdout == "42\n"
    assert sandbox.run_code("echo $((6 * 7)); exit 4", language="bash").exit_code == 4
    r = sandbox.run_code("import sys; sys.exit('boom')")
    assert r.exit_code == 1 and "boom" in r.stderr
    with pytest.raises(ValueError):
        sandbox.run_code("x", language="cobol")  # type: ignore[arg-type]


@pytest.mark.skipif(
    shutil.which("node", path="/usr/local/bin:/usr/bin:/bin") is None,
    reason="no node under /usr, where a local sandbox could see it",
)
def test_run_code_node(sandbox: Sandbox) -> None:
    assert sandbox.run_code("console.log(6 * 7)", language="node").stdout == "42\n"


def _site() -> str:
    site = os.environ.get("TETHER_TEST_SANDBOX_SITE", "")
    if not site or not os.path.isdir(site):
        raise RuntimeError(
            "matplotlib for the sandbox is not installed; run sdk/python/check, which puts it "
            "in /usr/local/lib/tether-sdk-test-site and sets TETHER_TEST_SANDBOX_SITE"
        )
    return site


def test_session_keeps_state_and_returns_a_matplotlib_png(sandbox: Sandbox) -> None:
    with sandbox.code_session(env={"PYTHONPATH": _site()}) as py:
        assert py.run("x = 21\nprint('set')").stdout == "set\n"
        r = py.run("y = x * 2\ny")
        assert (r.value, r.error, r.stdout) == ("42", None, "")
        r = py.run(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [x, y, 0])\nplt.title('t')\nNone"
        )
        assert r.error is None, r.error
        assert len(r.images) == 1 and r.images[0].startswith(b"\x89PNG\r\n\x1a\n")
        assert py.run("1 + 1").images == []  # figures are returned once, then closed


def test_session_returns_the_data_behind_its_charts(sandbox: Sandbox) -> None:
    with sandbox.code_session(env={"PYTHONPATH": _site()}) as py:
        r = py.run(
            "import matplotlib.pyplot as plt\n"
            "plt.plot([1, 2], [3, 4], label='up'); plt.title('line'); plt.xlabel('x')\n"
            "plt.figure(); plt.bar(['a', 'b'], [5, 7]); plt.ylabel('n')\n"
            "plt.figure(); plt.scatter([0.5], [1.5])\n"
            "fig, (left, right) = plt.subplots(1, 2); left.plot([0, 1]); fig.suptitle('two')\n"
            "plt.figure(); plt.text(0, 0, 'no data')\n"
        )
        assert r.error is None, r.error
        assert len(r.charts) == len(r.images) == 5
        line, bar, scatter, two, empty = r.charts
        assert (line["type"], line["title"], line["x_label"]) == ("line", "line", "x")
        assert line["elements"] == [{"label": "up", "points": [[1, 3], [2, 4]]}]
        assert (bar["type"], bar["y_label"]) == ("bar", "n")
        assert [(e["label"], e["value"]) for e in bar["elements"]] == [("a", 5), ("b", 7)]
        assert scatter["type"] == "scatter" and scatter["elements"][0]["points"] == [[0.5, 1.5]]
        assert (two["type"], two["title"]) == ("superchart", "two")
        assert [c["type"] for c in two["elements"]] == ["line", "unknown"]
        assert (empty["type"], empty["elements"]) == ("unknown", [])
        assert py.run("1 + 1").charts == []


def test_session_errors_stdout_stderr_and_subprocesses(sandbox: Sandbox) -> None:
    with sandbox.code_session() as py:
        r = py.run("def f():\n    return 1 / 0\nf()")
        assert r.error is not None and r.error.name == "ZeroDivisionError"
        assert any("return 1 / 0" in line for line in r.error.traceback)
        assert not any("_code_driver" in line for line in r.error.traceback)
        r = py.run(
            "import os, sys\nprint('out')\nprint('err', file=sys.stderr)\nos.system('echo child')"
        )
        assert r.stdout == "out\nchild\n" and r.stderr == "err\n" and r.value == "0"
        assert py.run("input()").error is not None  # stdin is /dev/null, not the driver's
        assert py.run("raise SystemExit(3)").error is not None
        assert py.run("'still alive'").value == "'still alive'"
        r = py.run("syntax error here")
        assert r.error is not None and r.error.name == "SyntaxError"


def test_session_timeout_interrupts_and_keeps_state(sandbox: Sandbox) -> None:
    with sandbox.code_session() as py:
        py.run("kept = 'yes'")
        with pytest.raises(CommandTimeout):
            py.run("import time\nwhile True: time.sleep(0.01)", timeout=0.5)
        assert py.run("kept").value == "'yes'"


async def test_async_session(asandbox: AsyncSandbox) -> None:
    py = await asandbox.code_session()
    try:
        await py.run("import math")
        assert (await py.run("math.sqrt(16)")).value == "4.0"
    finally:
        await py.close()


async def test_session_survives_a_dropped_connection(asandbox: AsyncSandbox) -> None:
    py = await asandbox.code_session()
    try:
        await py.run("counter = 41")
        conn = asandbox._conn
        assert conn is not None
        conn.abort()
        # The driver runs on as a background process; the session re-attaches to it.
        assert (await py.run("counter + 1")).value == "42"
    finally:
        await py.close()
