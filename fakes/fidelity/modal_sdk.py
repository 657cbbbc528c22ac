"""Checks the fake Modal against Modal's official Python SDK (see requirements.txt).

Run by tests/tests/e2e/providers_fidelity.rs with MODAL_TOKEN_ID, MODAL_TOKEN_SECRET and
MODAL_SERVER_URL (plain http://: the SDK's grpclib speaks HTTP/2 without TLS to it) pointing
at `tether-fake modal`. Exits non-zero, with the reason, on any mismatch.
"""

import modal

app = modal.App.lookup("tether-fidelity", create_if_missing=True)
print("app", app.app_id)

image = modal.Image.from_registry("alpine:3.21")
sb = modal.Sandbox.create("sleep", "infinity", app=app, image=image, timeout=120)
print("created", sb.object_id)

listed = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id)]
assert listed == [sb.object_id], listed
print("listed", len(listed))

sb.terminate()
sb.wait(raise_on_termination=False)
assert sb.returncode is not None, sb.returncode
assert [s.object_id for s in modal.Sandbox.list(app_id=app.app_id)] == []
print("terminated", sb.returncode)
