"""Checks the fake Runloop against Runloop's official Python SDK (see requirements.txt).

Run by tests/tests/e2e/providers_fidelity.rs with RUNLOOP_API_KEY and RUNLOOP_BASE_URL pointing
at `tether-fake runloop`, and FIDELITY_BASE_IMAGE naming a registry image (with /bin/sh) for
blueprint builds. Exits non-zero, with the reason, on any mismatch.
"""

import http.client
import os
import pathlib
import tempfile
import time
import urllib.parse

from runloop_api_client import AuthenticationError, BadRequestError, Runloop
from runloop_api_client.sdk import RunloopSDK

client = Runloop()
sdk = RunloopSDK()
api = urllib.parse.urlsplit(os.environ["RUNLOOP_BASE_URL"])
base_image = os.environ["FIDELITY_BASE_IMAGE"]


def until(what, check, timeout=60):
    """Polls check() until it is truthy; its value."""
    deadline = time.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def through_tunnel(url, path, headers=None):
    """GET path through a tunnel URL as the SDK builds it: the fake serves every tunnel on its
    own address and routes by Host, as Runloop's edge does by name."""
    host = urllib.parse.urlsplit(url).hostname
    conn = http.client.HTTPConnection(api.hostname, api.port, timeout=30)
    conn.request("GET", path, headers={"Host": host, **(headers or {})})
    answer = conn.getresponse()
    body = answer.read()
    conn.close()
    return answer.status, body


def exec_output(devbox_id, command):
    started = client.devboxes.execute_async(devbox_id, command=command)
    done = until(
        f"`{command}` to finish",
        lambda: (
            lambda e: e if e.status == "completed" else None
        )(client.devboxes.executions.retrieve(started.execution_id, devbox_id=devbox_id)),
    )
    return done.exit_status, done.stdout


# A refused key is the SDK's AuthenticationError.
try:
    Runloop(bearer_token="not-a-key", max_retries=0).devboxes.list()
except AuthenticationError:
    print("refused a wrong key")
else:
    raise AssertionError("the fake accepted a wrong key")

# Network policies: deny-all, an allowlist, and Runloop's refusal of a CIDR with host bits.
deny = client.network_policies.create(name="fidelity-deny")
assert deny.egress.allow_all is False and deny.egress.allowed_hostnames == [], deny
fenced = client.network_policies.create(
    name="fidelity-allow",
    allowed_hostnames=["github.com", "*.npmjs.org"],
    allowed_cidrs=[{"cidr": "10.12.0.0/16"}],
)
read = client.network_policies.retrieve(fenced.id)
assert read.egress.allowed_hostnames == ["github.com", "*.npmjs.org"], read
assert read.egress.allowed_cidrs[0].cidr == "10.12.0.0/16", read
try:
    client.network_policies.create(name="bad", allowed_cidrs=[{"cidr": "10.12.0.1/16"}])
except BadRequestError as e:
    assert "canonical" in str(e), e
    print("refused a CIDR with host bits")
else:
    raise AssertionError("the fake accepted 10.12.0.1/16")
print("network policies kept")

# A devbox with env, an entrypoint, a size, a keep-alive time, a policy and an authenticated
# tunnel; the entrypoint serves what it saw of its environment.
serve = (
    'mkdir -p /tmp/site && echo "$GREETING" > /tmp/site/greeting && '
    "exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp/site"
)
devbox = client.devboxes.create_and_await_running(
    name="fidelity",
    environment_variables={"GREETING": "hello from runloop"},
    entrypoint=serve,
    metadata={"fidelity": "runloop"},
    launch_parameters={
        "keep_alive_time_seconds": 600,
        "network_policy_id": deny.id,
        "resource_size_request": "CUSTOM_SIZE",
        "custom_cpu_cores": 2,
        "custom_gb_memory": 4,
        "custom_disk_size": 8,
    },
    tunnel={"auth_mode": "authenticated", "http_keep_alive": True},
)
assert devbox.status == "running", devbox.status
assert devbox.launch_parameters.network_policy_id == deny.id, devbox.launch_parameters
assert devbox.tunnel.auth_mode == "authenticated" and devbox.tunnel.auth_token, devbox.tunnel
print("created", devbox.id)

url = sdk.devbox.from_id(devbox.id).get_tunnel_url(8000)
assert url and url.startswith("https://8000-") and ".tunnel." in url, url
auth = {"X-Runloop-Tunnel-Authorization": f"Bearer {devbox.tunnel.auth_token}"}
status, _ = through_tunnel(url, "/greeting")
assert status == 401, status
status, _ = through_tunnel(url, "/greeting", {"X-Runloop-Tunnel-Authorization": "Bearer wrong"})
assert status == 401, status
body = until(
    "the entrypoint's server",
    lambda: (lambda s, b: b if s == 200 else None)(*through_tunnel(url, "/greeting", auth)),
)
assert body == b"hello from runloop\n", body
print("tunnel traffic authenticated by its token; env reached the entrypoint")

code, out = exec_output(devbox.id, 'echo "$GREETING"')
assert (code, out) == (0, "hello from runloop\n"), (code, out)
print("execute_async sees the devbox's environment")

# Lists page by cursor; metadata is read back.
listed = [d.id for d in client.devboxes.list(limit=1) if d.metadata.get("fidelity") == "runloop"]
assert listed == [devbox.id], listed
print("listed by metadata")

client.devboxes.keep_alive(devbox.id)
suspended = client.devboxes.suspend(devbox.id)
assert suspended.status in ("suspending", "suspended"), suspended.status
assert client.devboxes.await_suspended(devbox.id).status == "suspended"
status, _ = through_tunnel(url, "/greeting", auth)
assert status == 503, status
client.devboxes.resume(devbox.id)
assert client.devboxes.await_running(devbox.id).status == "running"
# A resume restarts no process: nothing serves the port until something starts it.
status, _ = through_tunnel(url, "/greeting", auth)
assert status == 502, status
print("suspended and resumed")

ended = client.devboxes.shutdown(devbox.id)
assert ended.status == "shutdown" and ended.shutdown_reason == "api_shutdown", ended
client.network_policies.delete(deny.id)
client.network_policies.delete(fenced.id)
print("shut down; its policy deleted")

# Runloop's timers: the keep-alive time, and a devbox bound to its entrypoint.
short = client.devboxes.create_and_await_running(launch_parameters={"keep_alive_time_seconds": 2})
timed_out = until(
    "the keep-alive time to run out",
    lambda: (lambda d: d if d.status == "shutdown" else None)(client.devboxes.retrieve(short.id)),
)
assert timed_out.shutdown_reason == "keep_alive_timeout", timed_out
once = client.devboxes.create(entrypoint="true")
exited = until(
    "the entrypoint to exit",
    lambda: (lambda d: d if d.status == "shutdown" else None)(client.devboxes.retrieve(once.id)),
)
assert exited.shutdown_reason == "entrypoint_exit", exited
try:
    client.devboxes.create(launch_parameters={"resource_size_request": "CUSTOM_SIZE", "custom_cpu_cores": 3, "custom_gb_memory": 8})
except BadRequestError as e:
    assert "CPU" in str(e), e
    print("refused 3 CPUs")
else:
    raise AssertionError("the fake accepted 3 CPUs")
print("keep-alive time and entrypoint exit end devboxes")

# A blueprint built from a Dockerfile with an uploaded build context.
with tempfile.TemporaryDirectory() as context:
    pathlib.Path(context, "marker.txt").write_text("built by runloop\n")
    obj = sdk.storage_object.upload_from_dir(context, name="fidelity-context.tar.gz")
blueprint = client.blueprints.create_and_await_build_complete(
    name="fidelity-blueprint",
    dockerfile=f"FROM {base_image}\nCOPY marker.txt /marker.txt\nENV FROM_BLUEPRINT=yes\n",
    build_context={"type": "object", "object_id": obj.id},
)
assert blueprint.status == "build_complete", blueprint
logs = client.blueprints.logs(blueprint.id).logs
assert any("FROM" in line.message for line in logs), logs
built = client.devboxes.create_and_await_running(blueprint_name="fidelity-blueprint")
assert built.blueprint_id == blueprint.id, built
code, out = exec_output(built.id, "cat /marker.txt")
assert (code, out) == (0, "built by runloop\n"), (code, out)
client.devboxes.shutdown(built.id)
print("blueprint built and run")

failing = client.blueprints.create(name="fidelity-failing", dockerfile=f"FROM {base_image}\nRUN false\n")
failed = until(
    "the failing build to end",
    lambda: (lambda b: b if b.status in ("failed", "build_complete") else None)(client.blueprints.retrieve(failing.id)),
)
assert failed.status == "failed" and failed.failure_reason == "build_failed", failed
try:
    client.devboxes.create(blueprint_id=failing.id)
except BadRequestError:
    print("a failed blueprint runs nothing")
else:
    raise AssertionError("the fake ran a failed blueprint")
