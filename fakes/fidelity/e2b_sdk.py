"""Checks the fake E2B against E2B's official Python SDK (see requirements.txt).

Run by tests/tests/e2e/providers_fidelity.rs with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL
pointing at `tether-fake e2b --page-size 2`, and FIDELITY_BASE_IMAGE naming a busybox image
(with a `/bin/bash` that runs busybox's sh, since the SDK runs commands with bash) in a
registry the test started. Exits non-zero, with the reason, on any mismatch.

Covers: create, get, list (paged), kill; env; envd's process and file APIs; the timeout
(moved, and ending a sandbox); pause (twice: the second finds it paused), the paused state in
get and in lists filtered by state, nothing answering inside a paused sandbox, and connect
resuming it with its files and processes; traffic through the edge to a server in the sandbox, with and
without the traffic access token; egress rules; and a template built with the SDK's
`Template` API (a registry base, a COPY of uploaded files, ENV, WORKDIR, a ready command),
whose ENV holds at build time only, as E2B documents.
"""

import os
import shlex
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

from e2b import ALL_TRAFFIC, Sandbox, SandboxQuery, SandboxState, Template

BASE = os.environ["FIDELITY_BASE_IMAGE"]
EDGE = os.environ["E2B_SANDBOX_URL"]

sbx = Sandbox.create(template="tether-fidelity", metadata={"fidelity": "e2b"}, envs={"GREETING": "hi there"}, timeout=120)
print("created", sbx.sandbox_id)

info = sbx.get_info()
assert info.sandbox_id == sbx.sandbox_id, info
assert info.metadata.get("fidelity") == "e2b", info.metadata

listed = Sandbox.list(query=SandboxQuery(metadata={"fidelity": "e2b"})).next_items()
assert [s.sandbox_id for s in listed] == [sbx.sandbox_id], listed
print("listed", len(listed))

# Lists come in pages (the fake serves 2 at most): the paginator follows x-next-token.
extra = [Sandbox.create(template="tether-fidelity", metadata={"fidelity": "e2b-page"}, timeout=120) for _ in range(3)]
pages = Sandbox.list(query=SandboxQuery(metadata={"fidelity": "e2b-page"}), limit=2)
seen = []
while pages.has_next:
    page = pages.next_items()
    assert len(page) <= 2, page
    seen.extend(s.sandbox_id for s in page)
assert sorted(seen) == sorted(s.sandbox_id for s in extra), (seen, extra)
for s in extra:
    s.kill()
print("listed in pages", len(seen))

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

# Traffic through the edge: a server in the sandbox (started through envd, in the
# background) answers at get_host(port), here through E2B_SANDBOX_URL with the host as E2B's
# edge routes it. It answers with its env, so the reply proves env reached it too.
SERVER = (
    "import http.server, os\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = os.environ['GREETING'].encode()\n"
    "        self.send_response(200)\n"
    "        self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "http.server.HTTPServer(('0.0.0.0', 8000), H).serve_forever()\n"
)


def through_edge(box, headers):
    request = urllib.request.Request(EDGE + "/", headers={"Host": box.get_host(8000), **headers})
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as e:
            # 502: nothing listens yet; anything else is the edge's answer.
            if e.code != 502 or time.monotonic() > deadline:
                return e.code, e.read().decode()
        time.sleep(0.2)


sbx.commands.run(f"python3 -c {shlex.quote(SERVER)}", background=True)
status, body = through_edge(sbx, {})
assert (status, body) == (200, "hi there"), (status, body)
print("edge traffic reached the sandbox's server")

# A sandbox without public traffic: the edge demands its traffic access token.
private = Sandbox.create(
    template="tether-fidelity", envs={"GREETING": "private"}, network={"allow_public_traffic": False}, timeout=120
)
assert private.traffic_access_token, "no traffic access token"
private.commands.run(f"python3 -c {shlex.quote(SERVER)}", background=True)
status, _ = through_edge(private, {})
assert status == 403, status
status, body = through_edge(private, {"e2b-traffic-access-token": private.traffic_access_token})
assert (status, body) == (200, "private"), (status, body)
private.kill()
print("the edge demanded the traffic access token")

# Pause and resume, as the SDK does them: pause keeps memory (processes) and files; while
# paused nothing inside answers (E2B's edge has no route to it); connect resumes it.
held = Sandbox.create(template="tether-fidelity", metadata={"fidelity": "e2b-pause"}, timeout=120)
held.commands.run("echo kept > /tmp/kept")
sleeper = held.commands.run("sleep 600", background=True)
assert held.pause() is True
assert Sandbox.pause(held.sandbox_id) is False  # E2B's 409: already paused
assert Sandbox.get_info(held.sandbox_id).state == SandboxState.PAUSED
by_state = lambda state: [  # noqa: E731
    s.sandbox_id
    for s in Sandbox.list(query=SandboxQuery(metadata={"fidelity": "e2b-pause"}, state=[state])).next_items()
]
assert by_state(SandboxState.PAUSED) == [held.sandbox_id], by_state(SandboxState.PAUSED)
assert by_state(SandboxState.RUNNING) == [], by_state(SandboxState.RUNNING)
envd = urllib.request.Request(EDGE + "/health", headers={"Host": held.get_host(49983)})
try:
    urllib.request.urlopen(envd, timeout=5)
except urllib.error.HTTPError as e:
    assert e.code == 502, e.code
else:
    raise AssertionError("envd answered in a paused sandbox")
print("paused", held.sandbox_id)

resumed = Sandbox.connect(held.sandbox_id, timeout=120)
assert Sandbox.get_info(held.sandbox_id).state == SandboxState.RUNNING
assert by_state(SandboxState.PAUSED) == [], by_state(SandboxState.PAUSED)
assert resumed.files.read("/tmp/kept") == "kept\n"
assert resumed.commands.run(f"kill -0 {sleeper.pid}").exit_code == 0  # still there
resumed.connect(timeout=120)  # a running sandbox: E2B's 200, only the timeout may grow
assert Sandbox.kill(held.sandbox_id) is True
try:
    Sandbox.pause(held.sandbox_id)
except Exception as e:  # the SDK's SandboxNotFoundException, from E2B's 404
    assert "not found" in str(e), e
else:
    raise AssertionError("pausing a killed sandbox succeeded")
print("resumed with its files and processes")

# A timeout ends the sandbox: E2B kills it, and it is gone.
short = Sandbox.create(template="tether-fidelity", metadata={"fidelity": "e2b-short"}, timeout=2)
deadline = time.monotonic() + 20
while Sandbox.list(query=SandboxQuery(metadata={"fidelity": "e2b-short"})).next_items():
    assert time.monotonic() < deadline, "a sandbox outlived its timeout"
    time.sleep(0.5)
assert Sandbox.kill(short.sandbox_id) is False
print("the timeout ended a sandbox")
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

# A template built with the SDK's Template API: the registry base, a file uploaded for a COPY
# step, ENV, WORKDIR, and a ready command that sees the ENV (steps run with it). A sandbox of
# the template has the file; the ENV does not reach its processes (E2B: "available only during
# template build"), while the sandbox's own envs do.
with tempfile.TemporaryDirectory() as context:
    with open(os.path.join(context, "data.txt"), "w") as f:
        f.write("copied by the SDK\n")
    template = (
        Template(file_context_path=context)
        .from_image(BASE)
        .copy("data.txt", "/opt/data/data.txt")
        .set_envs({"BUILD_ONLY": "at build"})
        .set_workdir("/opt/data")
        .set_ready_cmd('[ "$BUILD_ONLY" = "at build" ] && [ -f /opt/data/data.txt ]')
    )
    logs = []
    built = Template.build(template, "fidelity-built:v1", cpu_count=1, memory_mb=512, on_build_logs=logs.append)
    print("template built", built.template_id, len(logs), "log entries")

made = Sandbox.create(template="fidelity-built:v1", envs={"GREETING": "at run"}, timeout=120)
assert made.files.read("/opt/data/data.txt") == "copied by the SDK\n"
result = made.commands.run('echo "${BUILD_ONLY:-unset} $GREETING"')
assert result.stdout == "unset at run\n", result
made.kill()
print("the template runs its image; its ENV stayed at build time")

# A ready command that fails fails the build, with E2B's reason.
with tempfile.TemporaryDirectory() as context:
    broken = Template(file_context_path=context).from_image(BASE).set_ready_cmd("exit 3")
    try:
        Template.build(broken, "fidelity-broken:v1", cpu_count=1, memory_mb=512)
    except Exception as e:  # the SDK's BuildException, with the reason
        assert "ready command" in str(e), e
        print("a failing ready command failed the build:", e)
    else:
        raise AssertionError("a build whose ready command fails succeeded")
