"""A server whose relay is missing or refuses its token answers every call with a tool error
that says what to do."""

from __future__ import annotations

import pytest
from conftest import TETHER, Dirs, Relay
from helpers import fail
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

pytestmark = pytest.mark.anyio


async def call_with_env(env: dict[str, str], dirs: Dirs) -> dict[str, str]:
    params = StdioServerParameters(command=TETHER, args=["mcp", "--allow-dir", str(dirs.allowed)], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return await fail(session, "sandbox_list")


async def test_no_relay(relay: Relay, dirs: Dirs) -> None:
    # Port 1 on loopback: nothing listens there.
    error = await call_with_env({**relay.env(), "TETHER_RELAY": "http://127.0.0.1:1"}, dirs)
    assert error["code"] == "relay_unreachable"
    assert "tether serve" in error["message"]


async def test_a_wrong_relay_token(relay: Relay, dirs: Dirs) -> None:
    error = await call_with_env({**relay.env(), "TETHER_TOKEN": "not-a-token"}, dirs)
    assert error["code"] == "unauthorized"
