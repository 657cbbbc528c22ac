"""Test fixtures: one real relay (``tether serve`` from ``TETHER_BIN``) for the session, and
fresh local sandboxes made through it, deleted after each test."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tether_sandbox import AsyncSandbox, Sandbox, TetherError

REPO = Path(__file__).resolve().parents[3]
READY_TIMEOUT_S = 30.0


def _bin(env: str, name: str) -> str:
    path = os.environ.get(env) or str(REPO / "target" / "debug" / name)
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is not an executable; build it or set {env}")
    return path


@dataclass
class Relay:
    url: str
    token: str
    data_dir: Path


class RelayProcess:
    """``tether serve`` on ``listen`` (``127.0.0.1:0`` for any port) over ``data_dir``; ready
    once it prints its ``listening`` line."""

    def __init__(self, data_dir: Path, listen: str = "127.0.0.1:0") -> None:
        tether, agent = _bin("TETHER_BIN", "tether"), _bin("TETHER_AGENT_BIN", "tether-agent")
        env = dict(
            os.environ, TETHER_AGENT_BIN=agent, TETHER_LOG=os.environ.get("TETHER_LOG", "warn")
        )
        self.proc = subprocess.Popen(
            [tether, "serve", "--listen", listen, "--data-dir", str(data_dir)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        assert self.proc.stdout is not None
        # Readiness is the line the relay prints once it listens (stdout closes if it dies).
        self.url = ""
        for line in self.proc.stdout:
            if line.startswith("listening "):
                self.url = line.removeprefix("listening ").strip()
                break
        if not self.url:
            raise RuntimeError(f"the relay exited with {self.proc.wait()} before listening")
        self.token = (data_dir / "admin.token").read_text().strip()

    def stop(self) -> None:
        """Stops the relay; its sandboxes keep running."""
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def relay() -> Iterator[Relay]:
    """A real relay on an ephemeral port, with its own data directory and admin token."""
    with tempfile.TemporaryDirectory(prefix="tether-pysdk-") as tmp:
        data_dir = Path(tmp)
        process = RelayProcess(data_dir)
        try:
            os.environ["TETHER_RELAY"] = process.url
            os.environ["TETHER_TOKEN"] = process.token
            yield Relay(process.url, process.token, data_dir)
            # Delete whatever a failed test left behind.
            for info in Sandbox.list():
                try:
                    Sandbox.connect(info.id).delete()
                except TetherError:
                    pass
        finally:
            process.stop()


@pytest.fixture
def sandbox(relay: Relay) -> Iterator[Sandbox]:
    """A fresh local sandbox (blocking API), deleted after the test."""
    sb = Sandbox.create(labels={"test": "pysdk"}, ttl=600)
    try:
        yield sb
    finally:
        try:
            sb.delete()
        except TetherError:
            pass


@pytest.fixture
async def asandbox(relay: Relay) -> AsyncIterator[AsyncSandbox]:
    """A fresh local sandbox (async API), deleted after the test."""
    sb = await AsyncSandbox.create(labels={"test": "pysdk-async"}, ttl=600)
    try:
        yield sb
    finally:
        try:
            await sb.delete()
        except TetherError:
            pass
