"""Agno's E2B toolkit page, its agent: a code agent with the toolkit's tools, on Tether
sandboxes (``E2BToolkit`` is Tether's toolkit under the page's name). The agent creates a
sandbox, computes with numpy, draws a chart, and saves the chart's data beside this program's
working directory; then every sandbox it made is shut down."""

import json
import os

from agno.agent import Agent
from tether_sandbox.integrations.agno import E2BToolkit, SandboxManager

from _scripted import agno_model  # gpt-4o with OPENAI_API_KEY, else these calls in turn

CHART = """import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [3, 5, 4], label="sales"); plt.title("Q1"); plt.xlabel("month"); plt.show()"""
model = agno_model([
    ("create_sandbox", {"timeout": 300, "metadata": {"purpose": "data-analysis"}}),
    ("run_python_code", {"code": "import numpy as np\nprint(np.array([1, 2, 3]).mean())"}),
    ("run_python_code", {"code": CHART}),
    ("download_chart_data", {"result_index": 0, "output_path": "chart-data.json"}),
])

manager = SandboxManager(api_key=None, default_timeout=360)  # api_key: E2B's, ignored here
# numpy and matplotlib: a local sandbox runs the host's python3, whose packages may be elsewhere.
e2b_toolkit = E2BToolkit(manager, auto_create_default=False, python_env={"PYTHONPATH": os.environ.get("SANDBOX_PYTHONPATH", "")})

code_agent = Agent(
    name="Code Agent",
    role="Executing code in secure sandboxes",
    model=model,
    tools=[e2b_toolkit],
    instructions="""
    You execute code in sandboxes. Always create a sandbox before running code.
    Use appropriate timeouts based on task complexity.
    Clean up sandboxes when done.
    """,
)
try:
    run = code_agent.run("Compute the mean of [1, 2, 3], then chart Q1's sales and save the chart's data")
    print(run.content)
    with open("chart-data.json") as f:
        chart = json.load(f)
    print(chart["type"], chart["title"], chart["elements"])
finally:
    print(e2b_toolkit.shutdown_all_sandboxes())
