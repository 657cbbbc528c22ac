"""The OpenAI Agents SDK's sandbox agents on Tether: a ``SandboxAgent`` runs shell commands in a
Tether sandbox through ``TetherSandboxClient``; the program then reads a file the agent wrote,
keeps the workspace as a tar, and deletes the sandbox as the SDK's docs do."""

import asyncio
import io
import tarfile
from pathlib import Path

from agents import RunConfig, Runner
from agents.run_config import SandboxRunConfig
from agents.sandbox import SandboxAgent
from tether_sandbox.integrations.openai_agents import TetherSandboxClient, TetherSandboxClientOptions

from _scripted import agents_model  # gpt-4.1 with OPENAI_API_KEY, else these calls in turn

model = agents_model([
    ("exec_command", {"cmd": "python3 -c 'print(sum(range(101)))' > sum.txt && cat sum.txt"}),
])


async def main() -> None:
    client = TetherSandboxClient()  # TETHER_RELAY / TETHER_TOKEN, or relay=, token=
    session = await client.create(options=TetherSandboxClientOptions(ttl=600))
    agent = SandboxAgent(name="coder", instructions="Use the sandbox to compute.", model=model)
    async with session:
        result = await Runner.run(
            agent,
            "Add the numbers from 1 to 100 with Python; keep the answer in sum.txt",
            run_config=RunConfig(sandbox=SandboxRunConfig(session=session), tracing_disabled=True),
        )
        print(result.final_output)
        print("sum.txt:", (await session.read(Path("sum.txt"))).read())
        archive = (await session.persist_workspace()).read()  # a tar of /workspace
        print(sorted(n for n in tarfile.open(fileobj=io.BytesIO(archive)).getnames() if n.endswith(".txt")))
    await client.delete(session)  # after the session closed: deletes the sandbox


asyncio.run(main())
