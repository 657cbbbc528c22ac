"""Fixtures: a real relay (`tether serve`) with local sandboxes, `tether mcp` over stdio and
over streamable HTTP in front of it, and MCP clients from the official `mcp` package.

Every process is started here and waited on by reading the line it prints when ready;
nothing sleeps.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 60.0
HTTP_TOKEN = "mcp-test-token-" + os.urandom(16).hex()


def binary(name: str, env: str) -> str:
    path = os.environ.get(env) or str(REPO / "target" / "debug" / name)
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is not an executable: build it (cargo build) or set {env}")
    return path


TETHER = binary("tether", "TETHER_BIN")
AGENT = binary("tether-agent", "TETHER_AGENT_BIN")


def wait_for_line(stream: Any, prefix: str, proc: subprocess.Popen[str]) -> str:
    """The rest of the first line of `stream` starting with `prefix`; the stream keeps being
    drained afterwards so the process never blocks on a full pipe."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        found = False
        for line in stream:
            if not found and prefix in line:
                lines.put(line.split(prefix, 1)[1].strip())
                found = True
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        rest = lines.get(timeout=READY_TIMEOUT)
    except queue.Empty:
        proc.kill()
        raise RuntimeError(f"{proc.args} did not print {prefix!r} within {READY_TIMEOUT} s") from None
    if rest is None:
        raise RuntimeError(f"{proc.args} exited with {proc.wait()} before printing {prefix!r}")
    return rest


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Relay:
    """`tether serve` on a fresh data directory and an ephemeral loopback port."""

    def __init__(self, data: str) -> None:
        self.data = data
        self.proc, self.url = self._start("127.0.0.1:0")
        self.token = (Path(data) / "admin.token").read_text().strip()

    def _start(self, listen: str) -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen(
            [TETHER, "serve", "--listen", listen, "--data-dir", self.data],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "TETHER_AGENT_BIN": AGENT, "RUST_LOG": "warn", "TETHER_LOG": "warn"},
        )
        return proc, wait_for_line(proc.stdout, "listening ", proc)

    def restart(self) -> None:
        """Stops the relay (its sandboxes keep running) and starts it again at the same
        address on the same data directory, as an operator's restart does."""
        stop(self.proc)
        self.proc, url = self._start(self.url.removeprefix("http://"))
        assert url == self.url

    def stop(self) -> None:
        stop(self.proc)

    def rest(self, method: str, path: str) -> Any:
        req = urllib.request.Request(self.url + path, method=method, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def env(self) -> dict[str, str]:
        return {
            "TETHER_RELAY": self.url,
            "TETHER_TOKEN": self.token,
            "TETHER_AGENT_BIN": AGENT,
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
        }


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def relay() -> Iterator[Relay]:
    data = tempfile.mkdtemp(prefix="tether-mcp-relay-")
    relay = Relay(data)
    try:
        yield relay
    finally:
        try:
            for sandbox in relay.rest("GET", "/v1/sandboxes"):
                relay.rest("DELETE", f"/v1/sandboxes/{sandbox['id']}")
        finally:
            relay.stop()
            shutil.rmtree(data, ignore_errors=True)


@dataclass
class Dirs:
    """Host directories: `allowed` is given to `tether mcp --allow-dir`, `outside` is not."""

    allowed: Path
    outside: Path


@pytest.fixture(scope="session")
def dirs() -> Iterator[Dirs]:
    root = Path(tempfile.mkdtemp(prefix="tether-mcp-host-"))
    (root / "allowed").mkdir()
    (root / "outside").mkdir()
    (root / "outside" / "secret.txt").write_text("host secret\n")
    try:
        yield Dirs(allowed=(root / "allowed").resolve(), outside=(root / "outside").resolve())
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class HttpServer:
    url: str
    proc: subprocess.Popen[str]


def start_http(relay: Relay, dirs: Dirs, args: list[str], env: dict[str, str]) -> HttpServer:
    """`tether mcp --listen 127.0.0.1:0 ARGS`, once it says where it listens."""
    proc = subprocess.Popen(
        [TETHER, "mcp", "--listen", "127.0.0.1:0", "--allow-dir", str(dirs.allowed), *args],
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**relay.env(), **env},
    )
    rest = wait_for_line(proc.stderr, "listening on ", proc)
    return HttpServer(url=rest.split()[0], proc=proc)


@pytest.fixture(scope="session")
def http_server(relay: Relay, dirs: Dirs) -> Iterator[HttpServer]:
    server = start_http(relay, dirs, [], {"TETHER_MCP_TOKEN": HTTP_TOKEN})
    try:
        yield server
    finally:
        stop(server.proc)


@asynccontextmanager
async def http_client(url: str, token: str = HTTP_TOKEN) -> AsyncIterator[ClientSession]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60, read=300)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
    ):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


@asynccontextmanager
async def stdio_session(relay: Relay, dirs: Dirs) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=TETHER,
        args=["mcp", "--allow-dir", str(dirs.allowed)],
        env=relay.env(),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def modern_http_client(url: str) -> AsyncIterator[Client]:
    """The high-level client on the 2026-07-28 revision (no initialize, no MCP session)."""
    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {HTTP_TOKEN}"}, timeout=httpx2.Timeout(60, read=300)
        ) as http,
        Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as client,
    ):
        yield client


@asynccontextmanager
async def modern_stdio_client(relay: Relay, dirs: Dirs) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=TETHER, args=["mcp", "--allow-dir", str(dirs.allowed)], env=relay.env())
    async with Client(params, mode="2026-07-28") as client:
        yield client
