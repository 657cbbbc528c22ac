"""Checks the fake E2B against E2B's official Python SDK (see requirements.txt).

Run by tests/tests/e2e/providers_fidelity.rs with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL
pointing at `tether-fake e2b`. Exits non-zero, with the reason, on any mismatch.
"""

from e2b import Sandbox, SandboxQuery

sbx = Sandbox.create(template="tether-fidelity", metadata={"fidelity": "e2b"}, timeout=120)
print("created", sbx.sandbox_id)

info = sbx.get_info()
assert info.sandbox_id == sbx.sandbox_id, info
assert info.metadata.get("fidelity") == "e2b", info.metadata

listed = Sandbox.list(query=SandboxQuery(metadata={"fidelity": "e2b"})).next_items()
assert [s.sandbox_id for s in listed] == [sbx.sandbox_id], listed
print("listed", len(listed))

# envd's process API, as the SDK speaks it (Connect, JSON codec), through the edge.
result = sbx.commands.run("echo hello from envd")
assert result.stdout == "hello from envd\n", result
assert result.exit_code == 0, result
print("ran", repr(result.stdout))

sbx.set_timeout(300)
assert Sandbox.kill(sbx.sandbox_id) is True
assert Sandbox.kill(sbx.sandbox_id) is False  # a second kill finds nothing: E2B's 404
assert Sandbox.list(query=SandboxQuery(metadata={"fidelity": "e2b"})).next_items() == []
print("killed")
