"""Calling tools and reading their answers."""

from __future__ import annotations

import json
from typing import Any

from mcp import ClientSession
from mcp_types import CallToolResult

TOOLS = {
    "sandbox_create",
    "sandbox_list",
    "sandbox_delete",
    "sandbox_info",
    "sandbox_pause",
    "sandbox_resume",
    "sandbox_stop",
    "sandbox_start",
    "exec",
    "exec_start",
    "exec_poll",
    "exec_write_stdin",
    "exec_signal",
    "exec_list",
    "read_file",
    "write_file",
    "edit_file",
    "ls",
    "glob",
    "grep",
    "upload",
    "download",
}


def structured(result: Any) -> dict[str, Any]:
    assert isinstance(result, CallToolResult), result
    data = result.structured_content
    assert isinstance(data, dict), result
    # The text content carries the same JSON, for hosts that read only text.
    texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
    assert texts and json.loads(texts[0]) == data
    return data


async def call(session: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    """Calls `tool`; fails the test if the tool reports an error."""
    result = await session.call_tool(tool, args)
    data = structured(result)
    assert not result.is_error, f"{tool} failed: {data}"
    return data


async def fail(session: ClientSession, tool: str, **args: Any) -> dict[str, str]:
    """Calls `tool`, which must fail as a tool error; returns {code, message}."""
    result = await session.call_tool(tool, args)
    data = structured(result)
    assert result.is_error, f"{tool} should have failed: {data}"
    error = data["error"]
    assert error["code"] and error["message"], data
    return error
