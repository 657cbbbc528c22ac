"""Agno's E2B toolkit page, the toolkit's calls from a program (no agent): Python with state,
background jobs and their statuses, shell commands, file transfers, a server with a public
URL, several sandboxes at once, and the cleanup; on Tether sandboxes. Every tool returns
JSON, as Agno's tools return strings."""

import json
import os
import time
import urllib.request

from tether_sandbox.integrations.agno import E2BToolkit, SandboxManager

manager = SandboxManager(api_key=None, default_timeout=360)
toolkit = E2BToolkit(manager, auto_create_default=False, python_env={"PYTHONPATH": os.environ.get("SANDBOX_PYTHONPATH", "")})


def call(result: str) -> dict:
    return json.loads(result)


try:
    print(call(toolkit.create_sandbox(timeout=300, metadata={"purpose": "data-analysis"}))["status"])
    result = call(toolkit.run_python_code(code="import numpy as np\nprint(np.array([1, 2, 3]).mean())", timeout=60))
    print(result["status"], result["stdout"].strip())

    job = call(toolkit.run_python_code_background(code="import time; time.sleep(0.5); print('Done')"))
    print(call(toolkit.get_job_status(job["job_id"]))["status"] in ("pending", "running"))
    while (status := call(toolkit.get_job_status(job["job_id"])))["status"] in ("pending", "running"):
        time.sleep(0.1)
    print(status["status"], status["result"]["stdout"].strip())

    print(call(toolkit.run_command(command="echo $((6 * 7))"))["output"]["stdout"].strip())

    with open("data.csv", "w") as f:
        f.write("name,score\nada,1\n")
    print(call(toolkit.upload_file(local_path="data.csv", sandbox_path="/workspace/data.csv"))["sandbox_path"])
    call(toolkit.run_command(command="tr a-z A-Z < /workspace/data.csv > /workspace/upper.csv"))
    call(toolkit.download_file_from_sandbox(sandbox_path="/workspace/upper.csv", local_path="upper.csv"))
    print(open("upper.csv").read().splitlines())

    server = call(toolkit.run_server(command="python3 -m http.server 8000 --directory /workspace", port=8000))
    with urllib.request.urlopen(server["url"]) as page:
        print("served upper.csv:", "upper.csv" in page.read().decode())

    toolkit.create_sandbox(timeout=300, metadata={"purpose": "second"})
    results = call(toolkit.run_in_all_sandboxes(code="import sys; print(sys.version_info[0])", timeout_each=30))
    for sandbox_id, result in results["results"].items():
        print(f"{sandbox_id}: {result['stdout'].strip()}")
finally:
    for sid, result in call(toolkit.shutdown_all_sandboxes())["results"].items():
        print(f"Shutdown {sid}: {result['status']}")
