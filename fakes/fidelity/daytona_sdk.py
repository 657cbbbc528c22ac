"""Checks the fake Daytona against Daytona's official Python SDK (see requirements.txt).

Run by tests/tests/e2e/providers_fidelity.rs with DAYTONA_API_KEY and DAYTONA_API_URL pointing
at `tether-fake daytona`. Exits non-zero, with the reason, on any mismatch.
"""

import urllib.error
import urllib.request

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


def through_preview(headers):
    # The preview proxy's answer: 401 without a valid token (newer Daytona); with one, the
    # request reaches the port, where nothing listens in this sandbox (502).
    request = urllib.request.Request(preview.url + "/", headers=headers)
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


assert through_preview({}) == 401
assert through_preview({"x-daytona-preview-token": "wrong"}) == 401
assert through_preview({"x-daytona-preview-token": preview.token}) == 502
print("preview traffic authenticated by its token")

sandbox.stop()
assert daytona.get(sandbox.id).state == "stopped"
sandbox.start()
assert daytona.get(sandbox.id).state == "started"
print("stopped and started")

daytona.delete(sandbox)
assert list(daytona.list(ListSandboxesQuery(labels={"fidelity": "daytona"}))) == []
print("deleted")

# Network limits as the SDK sends them (networkAllowList / domainAllowList), kept and read back.
fenced = daytona.create(
    CreateSandboxFromSnapshotParams(labels={"fidelity": "daytona-egress"}, network_allow_list="10.1.0.0/16,192.0.2.7/32")
)
assert daytona.get(fenced.id).network_allow_list == "10.1.0.0/16,192.0.2.7/32", fenced
daytona.delete(fenced)
named = daytona.create(
    CreateSandboxFromSnapshotParams(labels={"fidelity": "daytona-egress"}, domain_allow_list="api.example.com,*.pypi.org")
)
assert daytona.get(named.id).domain_allow_list == "api.example.com,*.pypi.org", named
daytona.delete(named)
print("network limits kept")

# Daytona's own refusals: more than 10 networks, both lists at once.
eleven = ",".join(f"10.{i}.0.0/16" for i in range(11))
for bad, says in [
    (CreateSandboxFromSnapshotParams(network_allow_list=eleven), "more than 10 networks"),
    (CreateSandboxFromSnapshotParams(network_allow_list="10.0.0.0/8", domain_allow_list="a.example.com"), "mutually exclusive"),
]:
    try:
        daytona.create(bad)
    except Exception as e:  # DaytonaError carrying Daytona's message
        assert says in str(e), (bad, e)
        print("refused:", says)
    else:
        raise AssertionError(f"the fake accepted {bad}")
