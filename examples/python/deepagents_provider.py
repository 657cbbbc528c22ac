"""deepagents' sandbox pages on Tether: a sandbox from the provider (``TetherProvider``, what
deepagents-code finds as ``tether``), files seeded with ``upload_files``, an agent that writes
a small Python package and runs its tests, and the artifacts fetched with ``download_files``
(per-file errors, as on the page: one of the paths does not exist)."""

from deepagents import create_deep_agent
from tether_sandbox.integrations.deepagents import TetherProvider

from _scripted import chat_model

PACKAGE = "def mean(xs):\n    return sum(xs) / len(xs)\n"
TESTS = """import unittest
from stats import mean

class MeanTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 6]), 3)

unittest.main()
"""
# pytest is not on a bare local sandbox (it runs the host's python3): unittest is.
model = chat_model([
    ("write_file", {"file_path": "/workspace/stats/__init__.py", "content": PACKAGE}),
    ("write_file", {"file_path": "/workspace/test_stats.py", "content": TESTS}),
    ("execute", {"command": "cd /workspace && python3 test_stats.py 2>&1 | tee output.txt"}),
])

provider = TetherProvider(ttl=600)
backend = provider.get_or_create()
try:
    print(backend.execute("echo hello").output)
    backend.upload_files([("/workspace/README.md", b"# stats\nA mean() for the agent to test.\n")])
    agent = create_deep_agent(
        model=model,
        system_prompt="You are a Python coding assistant with sandbox access.",
        backend=backend,
    )
    result = agent.invoke(
        {"messages": [{"role": "user", "content": "Create a small Python package and run its tests"}]}
    )
    print(result["messages"][-1].content)
    for r in backend.download_files(["/workspace/stats/__init__.py", "/workspace/output.txt", "/workspace/missing.txt"]):
        if r.content is not None:
            print(f"{r.path}: {r.content.decode()}")
        else:
            print(f"Failed to download {r.path}: {r.error}")
finally:
    provider.delete(sandbox_id=backend.id)
