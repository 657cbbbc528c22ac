"""Checks the fake E2B against E2B's official Python SDK (see requirements.txt).

Run by tests/tests/e2e/providers_fidelity.rs with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL
pointing at `tether-fake e2b`. Exits non-zero, with the reason, on any mismatch.
"""

from datetime import datetime, timezone

from e2b import ALL_TRAFFIC, Sandbox, SandboxQuery

sbx = Sandbox.create(template="tether-fidelity", metadata={"fidelity": "e2b"}, envs={"GREETING": "hi there"}, timeout=120)
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

# The sandbox's env (envVars) reaches every process envd starts.
result = sbx.commands.run('echo "$GREETING"')
assert result.stdout == "hi there\n", result
print("env", repr(result.stdout))

# The timeout (TTL): set_timeout re-anchors endAt from now.
sbx.set_timeout(300)
left = (sbx.get_info().end_at - datetime.now(timezone.utc)).total_seconds()
assert 280 < left <= 301, left
print("timeout moved", round(left))
assert Sandbox.kill(sbx.sandbox_id) is True
assert Sandbox.kill(sbx.sandbox_id) is False  # a second kill finds nothing: E2B's 404
assert Sandbox.list(query=SandboxQuery(metadata={"fidelity": "e2b"})).next_items() == []
print("killed")

# Egress rules as the SDK sends them (network.allow_out / deny_out), kept and read back.
allowed = ["api.example.com", "*.pypi.org", "10.1.0.0/16"]
fenced = Sandbox.create(
    template="tether-fidelity",
    metadata={"fidelity": "e2b-egress"},
    network={"allow_out": allowed, "deny_out": [ALL_TRAFFIC]},
    timeout=120,
)
network = fenced.get_info().network or {}
assert network.get("allow_out") == allowed, network
assert network.get("deny_out") == [ALL_TRAFFIC], network
assert Sandbox.kill(fenced.sandbox_id) is True
print("egress kept", network)

# E2B's own refusals: a host name without ALL_TRAFFIC denied, a name in deny_out.
for bad, says in [
    ({"allow_out": ["api.example.com"]}, "ALL_TRAFFIC"),
    ({"deny_out": ["example.com"]}, "invalid denied CIDR"),
]:
    try:
        Sandbox.create(template="tether-fidelity", network=bad, timeout=60)
    except Exception as e:  # the SDK's InvalidArgument/Sandbox exception, with E2B's message
        assert says in str(e), (bad, e)
        print("refused", bad)
    else:
        raise AssertionError(f"the fake accepted {bad}")
