"""``tether mcp`` from an MCP client, as Claude Code or Cursor drive it: the official ``mcp``
package starts the server over stdio (``tether`` on the PATH; ``TETHER_RELAY`` and
``TETHER_TOKEN`` name the relay), lists its tools, and makes, uses and deletes a sandbox."""

import asyncio
import json
import os

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import TextContent

server = StdioServerParameters(command="tether", args=["mcp", "--allow-dir", os.getcwd()], env=dict(os.environ))


async def call(session: ClientSession, tool: str, **args: object) -> dict:
    result = await session.call_tool(tool, args)
    data = json.loads(next(c.text for c in result.content if isinstance(c, TextContent)))  # its JSON
    if result.isError:
        raise RuntimeError(f"{tool}: {data['error']['message']}")
    return data


async def main() -> None:
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        print(sorted(t.name for t in (await session.list_tools()).tools))
        sandbox = await call(session, "sandbox_create", labels={"example": "mcp"}, ttl_seconds=600)
        await call(session, "write_file", sandbox_id=sandbox["id"], path="/workspace/a.py", content="print(6 * 7)\n")
        ran = await call(session, "exec", sandbox_id=sandbox["id"], command="python3 /workspace/a.py")
        print(ran["output"], ran["exit_code"])
        await call(session, "sandbox_delete", sandbox_id=sandbox["id"])
        print("deleted", sandbox["id"])


asyncio.run(main())
