"""Checks the fake Daytona against Daytona's official Python SDK (see requirements.txt).

Run by tests/tests/e2e/providers_fidelity.rs with DAYTONA_API_KEY and DAYTONA_API_URL pointing
at `tether-fake daytona`. Exits non-zero, with the reason, on any mismatch.
"""

from daytona import CreateSandboxFromSnapshotParams, Daytona, ListSandboxesQuery

daytona = Daytona()

# No snapshot: Daytona's default image, whose entrypoint sleeps.
sandbox = daytona.create(CreateSandboxFromSnapshotParams(labels={"fidelity": "daytona"}, env_vars={"A": "1"}))
print("created", sandbox.id, sandbox.state)
assert sandbox.state == "started", sandbox.state

found = daytona.get(sandbox.id)
assert found.id == sandbox.id and found.labels.get("fidelity") == "daytona", found.labels

listed = list(daytona.list(ListSandboxesQuery(labels={"fidelity": "daytona"})))
assert [s.id for s in listed] == [sandbox.id], listed
print("listed", len(listed))

preview = sandbox.get_preview_link(7421)
assert preview.url.startswith("http") and preview.token, preview
print("preview", preview.url)

sandbox.stop()
assert daytona.get(sandbox.id).state == "stopped"
sandbox.start()
assert daytona.get(sandbox.id).state == "started"
print("stopped and started")

daytona.delete(sandbox)
assert list(daytona.list(ListSandboxesQuery(labels={"fidelity": "daytona"}))) == []
print("deleted")
