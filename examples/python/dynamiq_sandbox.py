"""Dynamiq's sandbox page, its two programs on a Tether sandbox instead of E2B's: driving a
sandbox directly (upload, run, list, retrieve, a port's public URL), then an ``Agent`` with a
sandbox attached through ``SandboxConfig``, which gains the shell, file and sandbox-info tools.
(One file for both: importing Dynamiq takes half a minute of CPU.)

Files under ``/home/user`` (E2B's home, which Dynamiq assumes) land under ``base_path``,
``/workspace``; shell commands run there. A local sandbox runs the host's python3 (there is no
``python``): the commands say python3."""

import time
import urllib.request

from dynamiq import Workflow
from dynamiq.flows import Flow
from dynamiq.nodes.agents import Agent
from dynamiq.sandboxes import SandboxConfig
from tether_sandbox.integrations.dynamiq import TetherSandbox

from _scripted import dynamiq_llm  # gpt-4o with OPENAI_API_KEY, else these calls in turn

# --- Driving a sandbox directly ---------------------------------------------------------------

with TetherSandbox(timeout=600) as sandbox:
    sandbox.upload_file("data.csv", b"name,score\nada,1\n", destination_path="/home/user/input/data.csv")

    result = sandbox.run_command_shell("wc -l /workspace/input/data.csv", timeout=30)
    print(result.stdout, result.exit_code)

    print(sandbox.list_files("/home/user/input"))
    print(sandbox.retrieve("/home/user/input/data.csv"))

    sandbox.run_command_shell("python3 -m http.server 8000 --directory input", run_in_background_enabled=True)
    info = sandbox.get_sandbox_info(port=8000)
    print(info.sandbox_id is not None, info.public_url is not None)
    for _ in range(50):  # until the server listens
        try:
            with urllib.request.urlopen(info.public_url) as page:  # the directory's listing
                print("served data.csv:", "data.csv" in page.read().decode())
            break
        except OSError:
            time.sleep(0.1)
sandbox.close(kill=True)  # the with block disconnected; this deletes the sandbox

# --- An agent with a sandbox ------------------------------------------------------------------

llm = dynamiq_llm([
    ("file-write", {"file_path": "/workspace/hello.py", "content": "print('Hello from', 'Tether!')\n"}),
    ("sandbox-shell", {"command": "python3 hello.py"}),
])
sandbox = TetherSandbox(timeout=3600)  # base_path /workspace; created on first use

agent = Agent(
    id="sandbox-agent",
    name="SandboxAgent",
    llm=llm,
    sandbox=SandboxConfig(enabled=True, backend=sandbox),
    role="You are a coding assistant that writes and runs scripts in the sandbox.",
    max_loops=10,
)

wf = Workflow(flow=Flow(nodes=[agent]))
try:
    result = wf.run(
        input_data={
            "input": "Create hello.py that prints 'Hello from Tether!', run it with python3, and show the output."
        }
    )
    print(result.output["sandbox-agent"]["output"]["content"])
finally:
    sandbox.close(kill=True)  # kill=True deletes the sandbox; close() only disconnects
