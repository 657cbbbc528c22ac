"""Fixtures for the framework adapters: the session relay of ``tests/conftest.py``, plus a
sandbox image WITHOUT python3 (Debian's static busybox and the static agent, built with
``tether image build``), and scripted chat models shared by the frameworks' agents."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether_sandbox import Sandbox, TetherError

REPO = Path(__file__).resolve().parents[4]
MUSL = "x86_64-unknown-linux-musl"
APPLETS = ["sh", "ls", "cat", "echo", "grep", "sed", "head", "mkdir", "rm", "wc", "sleep", "env"]


def _static_agent() -> Path:
    """The static (musl) agent images need: ``TETHER_STATIC_AGENT_BIN``, else the one ./test
    builds beside ``TETHER_AGENT_BIN`` (``TARGET/debug/..`` → ``TARGET/MUSL/release/..``),
    else built there as ./test does."""
    if env := os.environ.get("TETHER_STATIC_AGENT_BIN"):
        return Path(env)
    debug_agent = Path(os.environ.get("TETHER_AGENT_BIN") or REPO / "target/debug/tether-agent")
    target = debug_agent.absolute().parent.parent
    static = target / MUSL / "release" / "tether-agent"
    if not static.exists():
        subprocess.run(
            ["cargo", "build", "--release", "--locked", "--target", MUSL, "-p", "tether-agent"],
            cwd=REPO,
            check=True,
            env=dict(os.environ, CARGO_TARGET_DIR=str(target)),
        )
    return static


@pytest.fixture(scope="session")
def busybox_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``oci:PATH`` of an image holding busybox and the agent, and no python3."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(busybox):
        raise RuntimeError("busybox is missing: apt-get install -y busybox-static")
    work = tmp_path_factory.mktemp("busybox-image")
    root = work / "root"
    (root / "bin").mkdir(parents=True)
    (root / "tmp").mkdir()
    (root / "workspace").mkdir()
    shutil.copy(busybox, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    out = work / "image"
    subprocess.run(
        [
            os.environ.get("TETHER_BIN") or str(REPO / "target/debug/tether"),
            "image",
            "build",
            "--base",
            str(root),
            "--output",
            str(out),
            "--agent",
            str(_static_agent()),
            "--workdir",
            "/workspace",
        ],
        check=True,
        capture_output=True,
    )
    return f"oci:{out}"


@pytest.fixture
def busybox_sandbox(relay: object, busybox_image: str) -> Iterator[Sandbox]:
    sb = Sandbox.create(image=busybox_image, labels={"test": "adapters-busybox"}, ttl=600)
    try:
        yield sb
    finally:
        try:
            sb.delete()
        except TetherError:
            pass
