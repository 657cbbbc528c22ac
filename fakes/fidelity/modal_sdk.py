"""Checks the fake Modal against Modal's official Python SDK (see requirements.txt).

Run by tests/tests/e2e/providers_fidelity.rs with MODAL_TOKEN_ID, MODAL_TOKEN_SECRET and
MODAL_SERVER_URL (plain http://: the SDK's grpclib speaks HTTP/2 without TLS to it) pointing
at `tether-fake modal`, and FIDELITY_BASE_IMAGE naming a busybox image in a registry the
test started (image builds pull their base from it). Exits non-zero, with the reason, on any
mismatch.

Covers: create, list, terminate; env (a Secret from a dict, a named Secret); lifetimes (the
timeout and the idle timeout, and an open tunnel connection keeping a sandbox busy); tunnel
traffic to a server in the sandbox; network allowlists; an image build whose file of more
than 4 MiB goes through blob storage and a mount, as the SDK sends it; and gRPC's 4 MiB
message limit, which a file sent inline runs into.
"""

import hashlib
import json
import os
import socket
import tempfile
import time
import urllib.request

import modal
from modal._utils.async_utils import synchronizer
from modal_proto import api_pb2

BASE = os.environ["FIDELITY_BASE_IMAGE"]

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

# Lifetimes. The timeout ends a sandbox however busy it is: wait() raises, the return code is
# 124 (the SDK's for TIMEOUT).
started = time.monotonic()
short = modal.Sandbox.create("sleep", "infinity", app=app, image=image, timeout=2)
try:
    short.wait()
except modal.exception.SandboxTimeoutError:
    pass
else:
    raise AssertionError("a sandbox outlived its timeout")
assert short.returncode == 124, short.returncode
assert time.monotonic() - started < 30, "the timeout took far too long"
print("timed out", short.returncode)

# Tunnels: an encrypted port's tunnel reaches the server listening on it in the sandbox (the
# fake's tunnels are plain TCP on 127.0.0.1; Modal's terminate TLS). The server answers with
# the sandbox's env, so the reply proves both.
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
served = modal.Sandbox.create(
    "python3", "-c", SERVER, app=app, image=image, timeout=120, idle_timeout=3,
    encrypted_ports=[8000], env={"GREETING": "through the tunnel"},
)
tunnel = served.tunnels()[8000]
assert tunnel.host and tunnel.port, tunnel


def fetch():
    # The server may still be starting: a refused connection or a 502 means try again.
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"http://{tunnel.host}:{tunnel.port}/", timeout=5) as answer:
                return answer.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


assert fetch() == "through the tunnel"
print("tunnel traffic reached the sandbox's server")

# The idle timeout (3 s): an open connection through the tunnel keeps the sandbox active.
held = socket.create_connection((tunnel.host, tunnel.port))
time.sleep(5)
assert served.poll() is None, ("an open tunnel connection did not count as activity", served.returncode)
assert fetch() == "through the tunnel"
held.close()
# Then, with nothing open, it ends as IDLE_TIMEOUT within the idle timeout (and a reaper's tick).
served.wait(raise_on_termination=False)
# The status itself, not only the return code (an idle timeout's exit code is 0): the SDK's
# object behind the synchronous wrapper holds the result.
status = synchronizer._translate_in(served)._impl.result.status
assert status == api_pb2.GenericResult.GENERIC_STATUS_IDLE_TIMEOUT, status
print("idle timeout ended the sandbox once its tunnel was closed")

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

# An image build with a file of 5 MiB, as the SDK sends it: the registry base, then a layer
# copying a mount (`add_local_file(copy=True)`) whose file went through blob storage
# (BlobCreate, the upload, MountPutFile by blob id). A sandbox of the image has the file.
big = os.urandom(5 << 20)
digest = hashlib.sha256(big).hexdigest()
with tempfile.TemporaryDirectory() as scratch:
    path = os.path.join(scratch, "big.bin")
    with open(path, "wb") as f:
        f.write(big)
    built = modal.Image.from_registry(BASE).add_local_file(path, "/opt/big.bin", copy=True)
    check = modal.Sandbox.create(
        "sh", "-c", f'[ "$(busybox sha256sum /opt/big.bin | busybox cut -d " " -f 1)" = "{digest}" ]',
        app=app, image=built, timeout=120,
    )
    check.wait(raise_on_termination=False)
    assert check.returncode == 0, ("the image lacks the file, or holds other bytes", check.returncode)
    print("a 5 MiB file went through blob storage into the image")

    # The same file sent inline (`context_files` is sent as is, whatever its size) is a
    # message over gRPC's 4 MiB limit: RESOURCE_EXHAUSTED, which the SDK does not retry.
    inline = modal.Image.from_registry(BASE).dockerfile_commands(
        ["COPY /big.bin /opt/big.bin"], context_files={"/big.bin": path}
    )
    try:
        modal.Sandbox.create("true", app=app, image=inline, timeout=60)
    except modal.exception.ResourceExhaustedError as e:
        assert "larger than max" in str(e), e
        print("a message over 4 MiB refused:", e)
    else:
        raise AssertionError("the fake took a gRPC message over 4 MiB")
