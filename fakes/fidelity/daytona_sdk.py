"""Checks the fake Daytona against Daytona's official Python SDK (see requirements.txt).

Run by tests/tests/e2e/providers_fidelity.rs with DAYTONA_API_KEY and DAYTONA_API_URL pointing
at `tether-fake daytona --page-size 2`, and FIDELITY_BASE_IMAGE naming a busybox image in a
registry the test started. Exits non-zero, with the reason, on any mismatch.

Covers: create, get, list (paged by cursor), stop, start, delete; env; lifetimes (TTL and
auto-stop, set and read back); preview traffic and its token; network limits; and a snapshot
built from the SDK's `Image` (a Dockerfile: the registry base, ENV, WORKDIR, ENTRYPOINT) whose
sandbox serves, through its preview URL, the env it got from the image and from create.
"""

import json
import os
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

from daytona import (
    CreateSandboxFromSnapshotParams,
    CreateSnapshotParams,
    Daytona,
    Image,
    ListSandboxesQuery,
)

BASE = os.environ["FIDELITY_BASE_IMAGE"]

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

# Lists come in pages (the fake serves 2 at most): the SDK follows nextCursor.
extra = [daytona.create(CreateSandboxFromSnapshotParams(labels={"fidelity": "daytona-page"})) for _ in range(3)]
paged = [s.id for s in daytona.list(ListSandboxesQuery(labels={"fidelity": "daytona-page"}, limit=2))]
assert sorted(paged) == sorted(s.id for s in extra), (paged, extra)
for s in extra:
    daytona.delete(s)
print("listed in pages", len(paged))

# Lifetimes, set and read back: the TTL (autoDestroyAt from now) and the auto-stop interval.
sandbox.set_ttl(30)
left = (datetime.fromisoformat(daytona.get(sandbox.id).auto_destroy_at.replace("Z", "+00:00")) - datetime.now(timezone.utc)).total_seconds()
assert 30 * 60 - 60 < left <= 30 * 60 + 1, left
sandbox.set_autostop_interval(5)
assert daytona.get(sandbox.id).auto_stop_interval == 5
print("ttl and auto-stop kept", round(left))

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

# A snapshot built from the SDK's Image: a Dockerfile on the registry base with ENV, WORKDIR
# and an ENTRYPOINT that serves (busybox httpd) the env it sees. The sandbox's own env joins
# the image's, and its preview URL carries the server's answer.
# (No double quotes: the SDK writes the ENTRYPOINT's JSON without escaping its arguments.)
SERVE = (
    "busybox mkdir -p /tmp/www && echo $FROM_IMAGE $FROM_SANDBOX $(pwd) > /tmp/www/env "
    "&& exec busybox httpd -f -p 8080 -h /tmp/www"
)
image = Image.base(BASE).env({"FROM_IMAGE": "baked in"}).workdir("/tmp").entrypoint(["/bin/sh", "-c", SERVE])
logs = []
snapshot = daytona.snapshot.create(CreateSnapshotParams(name="fidelity-built:v1", image=image), on_logs=logs.append)
assert snapshot.state == "active", snapshot.state
assert logs[-1].startswith("Created snapshot fidelity-built:v1"), logs
# The SDK streams the build log only while it sees the build running, which a quick build may
# not give it time to: read the log where build-logs-url says it is.
API = os.environ["DAYTONA_API_URL"]
AUTH = {"Authorization": "Bearer " + os.environ["DAYTONA_API_KEY"]}
with urllib.request.urlopen(urllib.request.Request(f"{API}/snapshots/{snapshot.id}/build-logs-url", headers=AUTH)) as answer:
    logs_url = json.load(answer)["url"]
with urllib.request.urlopen(urllib.request.Request(logs_url + "?follow=true", headers=AUTH)) as answer:
    build_log = answer.read().decode()
assert "ENV FROM_IMAGE='baked in'" in build_log, build_log
print("snapshot built", snapshot.name, "with its log")

served = daytona.create(CreateSandboxFromSnapshotParams(snapshot="fidelity-built:v1", env_vars={"FROM_SANDBOX": "given"}))
link = served.get_preview_link(8080)
request = urllib.request.Request(link.url + "/env", headers={"x-daytona-preview-token": link.token})
deadline = time.monotonic() + 20
while True:
    try:
        with urllib.request.urlopen(request) as answer:
            body = answer.read().decode()
            break
    except urllib.error.HTTPError as e:
        # 502: the server is still starting.
        assert e.code == 502 and time.monotonic() < deadline, e.code
        time.sleep(0.2)
assert body == "baked in given /tmp\n", body
daytona.delete(served)
print("the built snapshot's sandbox served its env through the preview")

# A Dockerfile the fake cannot build (RUN: it has no builder) ends build_failed with a reason.
try:
    daytona.snapshot.create(CreateSnapshotParams(name="fidelity-broken:v1", image=Image.base(BASE).run_commands("true")))
except Exception as e:  # DaytonaError with the snapshot's errorReason
    assert "RUN" in str(e), e
    print("an unbuildable Dockerfile failed:", e)
else:
    raise AssertionError("the fake built a RUN step")
