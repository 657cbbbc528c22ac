"""The package as users install it: ``python -m build`` makes the sdist and, from that sdist,
the wheel (so the sdist is complete); the wheel installs into a fresh venv with nothing else of
this repository, imports without any framework, and drives a real sandbox, its code session's
driver included (a data file that only the built artifact can be missing)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

SDK = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 600  # the build and the fresh venv fetch their dependencies from PyPI

PROGRAM = """
import tether_sandbox, tether_sandbox.integrations
from tether_sandbox import Sandbox
assert "site-packages" in tether_sandbox.__file__, tether_sandbox.__file__
with Sandbox.create(ttl=120) as sb:
    print(sb.commands.run("echo built").stdout.strip())
    with sb.code_session() as py:
        print(py.run("6 * 7").value)
    sb.delete()
"""


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_built_wheel_installs_and_runs(relay: object, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # The build backend comes from PyPI into an isolated env, pinned as ./check pins it.
    env = dict(os.environ, PIP_CONSTRAINT=str(SDK / "constraints.txt"))
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(SDK)],
        check=True,
        env=env,
        capture_output=True,
    )
    (sdist,) = dist.glob("tether_sandbox-*.tar.gz")
    (wheel,) = dist.glob("tether_sandbox-*-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for member in ("py.typed", "_code_driver.py", "integrations/agno/tools.py"):
        assert f"tether_sandbox/{member}" in names, member
    assert any(n.endswith("entry_points.txt") for n in names)
    assert any(n.endswith("/README.md") for n in tarfile.open(sdist).getnames())

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)],
        check=True,
        env=env,
        capture_output=True,
    )
    # Run from an empty directory so nothing of the source tree can be imported instead.
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run(
        [str(python), "-c", PROGRAM],
        cwd=tmp_path,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["built", "42"]
