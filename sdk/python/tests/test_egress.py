"""Allowlisted egress and secrets at create: the request carries them as the relay's API
spells them, the answer's network guarantees are read back, and a secret's value never shows
in a repr."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tether_sandbox import AsyncSandbox, NetworkInfo, Sandbox, Secret

ANSWER: dict[str, Any] = {
    "id": "sb-egress",
    "provider": "e2b",
    "provider_ref": "i123",
    "state": "running",
    "labels": {},
    "created_ms": 1,
    "last_active_ms": 1,
    "created": True,
    "network": {
        "mode": "allowlist",
        "egress": {"allow_hosts": ["*.pypi.org"], "allow_cidrs": ["10.1.0.0/16"]},
        "secrets": [{"name": "OPENAI_API_KEY", "hosts": ["api.openai.com"]}],
        "enforced_by": "e2b",
        "guarantees": ["E2B's firewall denies all outbound IPv4 except allowOut"],
        "not_guaranteed": ["DNS exfiltration"],
    },
}


class _Recorder:
    """A loopback relay stand-in: records each request body, answers ``ANSWER``."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                outer.bodies.append(json.loads(self.rfile.read(length)))
                payload = json.dumps(ANSWER).encode()
                self.send_response(201)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    r = _Recorder()
    yield r
    r.server.shutdown()


def test_create_sends_the_allowlist_and_secrets(recorder: _Recorder) -> None:
    secret = Secret("OPENAI_API_KEY", ("api.openai.com",), value="sk-test-value")
    sb = Sandbox.create(
        provider="e2b",
        allow_hosts=["*.pypi.org"],
        allow_cidrs=["10.1.0.0/16"],
        secrets=[secret, Secret("GITHUB_TOKEN", ["api.github.com"])],
        relay=recorder.url,
        token="t",
    )
    assert recorder.bodies == [
        {
            "provider": "e2b",
            "network": "allowlist",
            "egress": {"allow_hosts": ["*.pypi.org"], "allow_cidrs": ["10.1.0.0/16"]},
            "secrets": [
                {"name": "OPENAI_API_KEY", "hosts": ["api.openai.com"], "value": "sk-test-value"},
                {"name": "GITHUB_TOKEN", "hosts": ["api.github.com"]},
            ],
        }
    ]
    network = sb.info.network
    assert isinstance(network, NetworkInfo)
    assert network.mode == "allowlist" and network.enforced_by == "e2b"
    assert network.allow_hosts == ["*.pypi.org"] and network.allow_cidrs == ["10.1.0.0/16"]
    assert [s.name for s in network.secrets] == ["OPENAI_API_KEY"]
    assert network.not_guaranteed == ["DNS exfiltration"]
    assert "sk-test-value" not in repr(secret)
    sb.close()


def test_a_preset_is_sent_as_written_for_the_relay_to_expand(recorder: _Recorder) -> None:
    sb = Sandbox.create(allow_hosts=["@package-registries"], relay=recorder.url, token="t")
    assert recorder.bodies == [
        {"network": "allowlist", "egress": {"allow_hosts": ["@package-registries"]}}
    ]
    sb.close()


async def test_async_create_sends_the_mode_alone(recorder: _Recorder) -> None:
    sb = await AsyncSandbox.create(network="allowlist", relay=recorder.url, token="t")
    assert recorder.bodies == [{"network": "allowlist"}]
    await sb.close()


def test_an_allowlist_with_another_mode_is_refused_before_sending(recorder: _Recorder) -> None:
    with pytest.raises(ValueError, match="allowlist"):
        Sandbox.create(network="host", allow_hosts=["a.test"], relay=recorder.url, token="t")
    with pytest.raises(TypeError, match="list of strings"):
        Sandbox.create(allow_hosts="a.test", relay=recorder.url, token="t")
    assert recorder.bodies == []
