"""Checks the fake Modal against Modal's official Python SDK (see requirements.txt).

Run by tests/tests/e2e/providers_fidelity.rs with MODAL_TOKEN_ID, MODAL_TOKEN_SECRET and
MODAL_SERVER_URL (plain http://: the SDK's grpclib speaks HTTP/2 without TLS to it) pointing
at `tether-fake modal`. Exits non-zero, with the reason, on any mismatch.
"""

import json
import os
import urllib.request

import modal

app = modal.App.lookup("tether-fidelity", create_if_missing=True)
print("app", app.app_id)

image = modal.Image.from_registry("alpine:3.21")
sb = modal.Sandbox.create("sleep", "infinity", app=app, image=image, timeout=120)
print("created", sb.object_id)

# Env as the SDK sends it: a Secret from a dict (V1: SecretGetOrCreate, then secret_ids) or
# inline secret sources (V2), plus a named Secret by id; the sandbox's command checks it got both.
modal.Secret.objects.create("tether-fidelity-named", {"NAMED": "from a named secret"}, allow_existing=True)
named = modal.Secret.from_name("tether-fidelity-named", required_keys=["NAMED"])
checked = modal.Sandbox.create(
    "sh", "-c", '[ "$GREETING" = "hi there" ] && [ "$NAMED" = "from a named secret" ]',
    app=app, image=image, timeout=120, env={"GREETING": "hi there"}, secrets=[named],
)
checked.wait(raise_on_termination=False)
assert checked.returncode == 0, ("env did not reach the sandbox", checked.returncode)
print("env reached the sandbox")

listed = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id)]
assert listed == [sb.object_id], listed
print("listed", len(listed))

sb.terminate()
sb.wait(raise_on_termination=False)
assert sb.returncode is not None, sb.returncode
assert [s.object_id for s in modal.Sandbox.list(app_id=app.app_id)] == []
print("terminated", sb.returncode)

# Outbound allowlists as the SDK builds them (network_access ALLOWLIST with CIDRs and domains),
# as the fake received them (GET /__fake/sandboxes: Modal has no call that reads them back).
fenced = modal.Sandbox.create(
    "sleep", "infinity", app=app, image=image, timeout=120,
    outbound_cidr_allowlist=["10.1.0.0/16"], outbound_domain_allowlist=["api.example.com", "*.pypi.org"],
)
with urllib.request.urlopen(os.environ["MODAL_SERVER_URL"] + "/__fake/sandboxes") as answer:
    seen = {s["id"]: s for s in json.load(answer)}
network = seen[fenced.object_id]["network_access"]
assert network == {
    "network_access_type": "ALLOWLIST",
    "allowed_cidrs": ["10.1.0.0/16"],
    "allowed_domains": ["api.example.com", "*.pypi.org"],
}, network
fenced.terminate()
print("allowlist kept", network)
