"""The relay: create, get-or-create, list, get, renew, delete; retries on 429/5xx; clear
errors for a missing relay, a bad token and a dead sandbox."""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Iterator

import httpx
import pytest

from conftest import Relay
from tether_sandbox import (
    AsyncSandbox,
    AuthenticationError,
    InvalidRequest,
    RelayUnavailable,
    RelayUnreachable,
    Sandbox,
    SandboxGone,
    SandboxNotFound,
)


def test_create_get_or_create_list_renew_delete(relay: Relay) -> None:
    labels = {"thread": "t-lifecycle"}
    first = Sandbox.get_or_create(labels, ttl=600, env={"FROM_CREATE": "yes"})
    try:
        assert first.info.created and first.info.labels == labels
        again = Sandbox.get_or_create(labels)
        assert again.id == first.id and not again.info.created
        again.close()
        assert [s.id for s in Sandbox.list(labels=labels)] == [first.id]
        assert Sandbox.connect(first.id).info.state == "running"
        before = first.info.expires_ms or 0
        assert (first.renew(3600).expires_ms or 0) > before
        assert first.commands.run("echo $FROM_CREATE").stdout == "yes\n"
        assert first.agent_info().user == "root"
        assert "exec" in first.capabilities()
    finally:
        first.delete()
    assert Sandbox.list(labels=labels) == []
    with pytest.raises(SandboxNotFound):
        Sandbox.connect(first.id)


def test_get_or_create_needs_labels(relay: Relay) -> None:
    with pytest.raises(ValueError):
        Sandbox.create(get_or_create=True)


def test_bad_requests_and_credentials(relay: Relay) -> None:
    with pytest.raises(InvalidRequest) as bad:
        Sandbox.create(cpus=-1)
    assert bad.value.status == 400 and bad.value.message
    with pytest.raises(AuthenticationError) as auth:
        Sandbox.list(token="not-a-token")
    assert auth.value.status == 401 and "not-a-token" not in str(auth.value)
    with pytest.raises(RelayUnreachable) as gone:
        Sandbox.list(relay="http://127.0.0.1:9")
    assert "TETHER_RELAY" in str(gone.value)


def test_a_deleted_sandbox_says_so(relay: Relay) -> None:
    sb = Sandbox.create(ttl=600)
    other = Sandbox.connect(sb.id)
    sb.delete()
    with pytest.raises(SandboxNotFound):
        other.commands.run("true")
    other.close()


class _Flaky:
    """A loopback HTTP server that answers the first ``failures`` requests with the given
    statuses, then forwards to the real relay."""

    def __init__(self, relay_url: str, failures: list[int]) -> None:
        self.failures = failures
        self.seen: list[int] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                if outer.failures:
                    status = outer.failures.pop(0)
                    outer.seen.append(status)
                    payload = b'{"error":{"code":"unavailable","message":"try later"}}'
                    self.send_response(status)
                    self.send_header("content-length", str(len(payload)))
                    self.send_header("retry-after", "0")
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                r = httpx.request(
                    self.command, relay_url + self.path, headers=headers, content=body
                )
                self.send_response(r.status_code)
                self.send_header("content-length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_GET = do_POST = do_DELETE = _any

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def flaky(relay: Relay) -> Iterator[_Flaky]:
    f = _Flaky(relay.url, [429, 503, 502])
    yield f
    f.server.shutdown()


def test_429_and_5xx_are_retried(relay: Relay, flaky: _Flaky) -> None:
    assert isinstance(Sandbox.list(relay=flaky.url), list)
    assert flaky.seen == [429, 503, 502]
    flaky.failures = [503] * 10
    with pytest.raises(RelayUnavailable):
        Sandbox.list(relay=flaky.url)
    flaky.failures = [500]
    with pytest.raises(RelayUnavailable):
        Sandbox.list(relay=flaky.url)
    assert flaky.failures == []  # a 500 is not retried


async def test_async_lifecycle(relay: Relay) -> None:
    async with await AsyncSandbox.create(labels={"k": "async-life"}, ttl=600) as sb:
        try:
            assert (await sb.refresh()).id == sb.id
            assert [s.id for s in await AsyncSandbox.list(labels={"k": "async-life"})] == [sb.id]
        finally:
            await sb.delete()


def test_an_expired_sandbox_is_gone(relay: Relay) -> None:
    sb = Sandbox.create(ttl=1)
    # The relay's reaper runs every second; ask until it has deleted the sandbox (bounded).
    for _ in range(300):
        try:
            sb.refresh()
        except SandboxGone as gone:
            assert gone.status == 410 and gone.message
            break
        Sandbox.list()  # paces the loop on a real round trip, not a sleep
    else:
        pytest.fail("the sandbox outlived its 1 s TTL")
    with pytest.raises(SandboxGone):
        sb.commands.run("true")
    sb.close()


async def test_the_token_never_reaches_a_log(
    relay: Relay, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    sb = await AsyncSandbox.create(ttl=600)
    try:
        assert (await sb.commands.run("echo x")).stdout == "x\n"
    finally:
        await sb.delete()
    assert caplog.records, "debug logging captured nothing: the test would prove nothing"
    assert relay.token not in caplog.text
    assert relay.token not in repr(sb._relay.config)
