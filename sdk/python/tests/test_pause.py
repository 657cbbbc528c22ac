"""Pause and resume through the SDK, on real local sandboxes: a paused sandbox's processes stop
and keep their state, a stream attached before the pause goes on after it with no gap, the
next call through the object that paused it resumes it (unless it was created with
``auto_resume=False``: then :class:`SandboxPaused` until ``resume()``), the idle timeout can
pause, and another tenant can neither see nor pause it. Sync and async."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from conftest import Relay
from tether_sandbox import (
    AsyncCommandHandle,
    AsyncSandbox,
    Conflict,
    ProviderUnsupported,
    RelayUnavailable,
    Sandbox,
    SandboxNotFound,
    SandboxPaused,
)
from tether_sandbox._relay import AsyncRelayClient, RelayConfig
from tether_sandbox.errors import relay_error

# A counter that prints 1, 2, 3... every 20 ms and keeps its last value in a file.
COUNTER = "i=0; while :; do i=$((i+1)); echo $i; echo $i > /workspace/n; sleep 0.02; done"
# How long a frozen counter is watched for a change: it would have counted 15 in that time.
FROZEN_FOR_S = 0.3
# How long the relay's reaper may take to act on an idle timeout (it ticks every second).
SETTLE_S = 20.0


def numbers(out: bytes) -> list[int]:
    return [int(line) for line in out.decode().split() if line.strip().isdigit()]


class Tally:
    """Reads a counter's output from its handle, on a task of its own (a read is never cut
    short), and wakes whoever waits for a number."""

    def __init__(self, handle: AsyncCommandHandle) -> None:
        self.out = bytearray()
        self._changed = asyncio.Condition()
        self._task = asyncio.create_task(self._pump(handle))

    async def _pump(self, handle: AsyncCommandHandle) -> None:
        async for chunk in handle:
            async with self._changed:
                self.out.extend(chunk.data)
                self._changed.notify_all()

    @property
    def seen(self) -> list[int]:
        return numbers(bytes(self.out))

    async def reach(self, last: int) -> None:
        async def counted() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: bool(self.seen) and self.seen[-1] >= last)

        await asyncio.wait_for(counted(), SETTLE_S)

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def tenant_token(relay: Relay, tenant: str) -> str:
    answer = httpx.post(
        f"{relay.url}/v1/tokens",
        json={"tenant": tenant, "admin": False},
        headers={"Authorization": f"Bearer {relay.token}"},
    )
    answer.raise_for_status()
    return str(answer.json()["token"])


async def test_a_paused_sandbox_freezes_and_an_attached_stream_loses_nothing(
    asandbox: AsyncSandbox,
) -> None:
    sb = asandbox
    assert sb.info.capabilities.pause
    assert sb.info.auto_resume and sb.info.on_idle == "delete"
    handle = await sb.commands.start(COUNTER, background=True)
    tally = Tally(handle)
    try:
        await tally.reach(5)

        info = await sb.pause()
        assert info.state == "paused" and sb.info.state == "paused"
        # Reading the state over REST does not wake it.
        assert (await sb.refresh()).state == "paused"
        assert [s.state for s in await AsyncSandbox.list(labels=sb.info.labels)] == ["paused"]

        # Frozen: nothing new on the attached stream (once the bytes in flight when it froze
        # have landed), for longer than it takes to count 15.
        await asyncio.sleep(FROZEN_FOR_S)
        settled = len(tally.out)
        await asyncio.sleep(FROZEN_FOR_S)
        assert len(tally.out) == settled, "a paused counter kept counting"
        assert (await sb.refresh()).state == "paused"

        await sb.resume()
        assert sb.info.state == "running"
        # The same stream goes on where it stopped: every number, in order, none missing.
        await tally.reach(tally.seen[-1] + 20)
        seen = tally.seen
        assert seen == list(range(1, seen[-1] + 1)), "the stream lost or reordered output"
        assert not handle.dropped
    finally:
        await tally.stop()
        await handle.kill()


async def test_a_stopped_sandbox_keeps_its_files_and_the_next_call_starts_it(
    asandbox: AsyncSandbox,
) -> None:
    sb = asandbox
    assert sb.info.capabilities.stop
    await sb.files.write("/workspace/kept", "kept")
    await sb.commands.run("sleep 1000 >/dev/null 2>&1 & echo $! > /workspace/pid")
    info = await sb.stop()
    assert info.state == "stopped"
    assert (await sb.refresh()).state == "stopped"
    with pytest.raises(Conflict):
        await sb.stop()
    # The next call boots it again: its files are there, its processes are not.
    result = await sb.commands.run(
        "cat /workspace/kept; kill -0 $(cat /workspace/pid) || echo ended"
    )
    assert result.stdout == "keptended\n"
    assert (await sb.refresh()).state == "running"
    with pytest.raises(Conflict):
        await sb.start()
    await sb.stop()
    assert (await sb.start()).state == "running"


def test_sync_stop_and_start(sandbox: Sandbox) -> None:
    sandbox.files.write("/workspace/kept", "kept")
    assert sandbox.stop().state == "stopped"
    assert sandbox.start().state == "running"
    assert sandbox.commands.run("cat /workspace/kept").stdout == "kept"


async def test_a_call_after_pause_resumes_the_sandbox(asandbox: AsyncSandbox) -> None:
    sb = asandbox
    await sb.files.write("/workspace/kept", "kept")
    await sb.pause()
    # The session this object holds stays open through the pause, and would not wake the
    # sandbox; the object resumes it before the call.
    result = await sb.commands.run("cat /workspace/kept")
    assert result.stdout == "kept"
    assert sb.info.state == "running"
    assert (await sb.refresh()).state == "running"


async def test_pausing_twice_and_resuming_what_runs_are_conflicts(asandbox: AsyncSandbox) -> None:
    sb = asandbox
    await sb.pause()
    with pytest.raises(SandboxPaused) as twice:
        await sb.pause()
    assert twice.value.status == 409 and twice.value.code == "conflict"
    await sb.resume()
    with pytest.raises(Conflict) as running:
        await sb.resume()
    assert not isinstance(running.value, SandboxPaused)
    assert running.value.status == 409 and running.value.message
    assert (await sb.commands.run("true")).exit_code == 0


async def test_without_auto_resume_a_paused_sandbox_stays_paused_until_resume(
    relay: Relay,
) -> None:
    sb = await AsyncSandbox.create(labels={"test": "pysdk-pause"}, ttl=600, auto_resume=False)
    try:
        assert not sb.info.auto_resume
        await sb.files.write("/workspace/kept", "kept")
        await sb.pause()
        with pytest.raises(SandboxPaused) as refused:
            await sb.commands.run("true")
        assert "resume()" in refused.value.message
        # Another client, on a session of its own, is refused by the relay itself.
        other = await AsyncSandbox.connect(sb.id)
        try:
            with pytest.raises(SandboxPaused) as relay_refused:
                await other.files.read_text("/workspace/kept")
            assert relay_refused.value.status == 409
            assert (await sb.refresh()).state == "paused"
            await sb.resume()
            assert await other.files.read_text("/workspace/kept") == "kept"
        finally:
            await other.aclose()
        assert (await sb.commands.run("cat /workspace/kept")).stdout == "kept"
    finally:
        await sb.delete()


async def test_a_sandbox_resumed_elsewhere_is_not_resumed_again(asandbox: AsyncSandbox) -> None:
    sb = asandbox
    await sb.pause()
    other = await AsyncSandbox.connect(sb.id)
    try:
        await other.resume()
    finally:
        await other.aclose()
    # This object still thinks it paused it: its wake finds it running, which is as good.
    assert (await sb.commands.run("echo on")).stdout == "on\n"


async def test_the_idle_timeout_can_pause_and_the_next_call_resumes(relay: Relay) -> None:
    sb = await AsyncSandbox.create(
        labels={"test": "pysdk-idle"}, ttl=600, idle_timeout=1, on_idle="pause"
    )
    try:
        assert sb.info.on_idle == "pause"
        await sb.files.write("/workspace/kept", "kept")
        await sb.close()  # idle means no session open
        deadline = time.monotonic() + SETTLE_S
        while (await sb.refresh()).state != "paused":
            assert time.monotonic() < deadline, "the idle sandbox was not paused"
            await AsyncSandbox.list()  # paces the loop on a real round trip, not a sleep
        # Paused by the relay, not this object: the new session resumes it (auto-resume).
        assert await sb.files.read_text("/workspace/kept") == "kept"
        assert (await sb.refresh()).state == "running"
    finally:
        await sb.delete()


def test_sync_pause_resume_and_conflicts(sandbox: Sandbox) -> None:
    sandbox.files.write("/workspace/kept", "kept")
    assert sandbox.pause().state == "paused"
    with pytest.raises(SandboxPaused):
        sandbox.pause()
    assert sandbox.refresh().state == "paused"
    # The next call resumes it.
    assert sandbox.files.read_text("/workspace/kept") == "kept"
    assert sandbox.refresh().state == "running"
    sandbox.pause()
    assert sandbox.resume().state == "running"
    with pytest.raises(Conflict):
        sandbox.resume()


def test_sync_a_stream_attached_before_the_pause_goes_on(sandbox: Sandbox) -> None:
    handle = sandbox.commands.start(COUNTER, background=True)
    out = bytearray()
    chunks = iter(handle)
    while len(numbers(bytes(out))) < 5:
        out.extend(next(chunks).data)
    sandbox.pause()
    sandbox.resume()
    target = numbers(bytes(out))[-1] + 20
    while numbers(bytes(out))[-1] < target:
        out.extend(next(chunks).data)
    seen = numbers(bytes(out))
    assert seen == list(range(1, seen[-1] + 1)), "the stream lost or reordered output"
    handle.kill()


def test_sync_without_auto_resume(relay: Relay) -> None:
    with Sandbox.create(labels={"test": "pysdk-pause"}, ttl=600, auto_resume=False) as sb:
        try:
            sb.pause()
            with pytest.raises(SandboxPaused):
                sb.commands.run("true")
            sb.resume()
            assert sb.commands.run("true").exit_code == 0
        finally:
            sb.delete()


async def test_another_tenant_can_neither_pause_nor_resume(
    relay: Relay, asandbox: AsyncSandbox
) -> None:
    token = tenant_token(relay, "intruder")
    with pytest.raises(SandboxNotFound):
        await AsyncSandbox.connect(asandbox.id, token=token)
    intruder = AsyncRelayClient(RelayConfig(relay.url, token))
    try:
        for call in (intruder.pause, intruder.resume):
            with pytest.raises(SandboxNotFound) as refused:
                await call(asandbox.id)
            assert refused.value.status == 404
            assert "paused" not in refused.value.message
    finally:
        await intruder.aclose()
    assert (await asandbox.refresh()).state == "running"


def test_relay_refusals_map_to_their_errors() -> None:
    # The local provider pauses, so a relay's 501 is mapped here from its wire form
    # (relay/server/src/error.rs): `unsupported` is not worth a retry, unlike other 5xx.
    unsupported = relay_error(501, "unsupported", "provider `e2b` cannot pause")
    assert isinstance(unsupported, ProviderUnsupported)
    assert not isinstance(unsupported, RelayUnavailable)
    assert isinstance(relay_error(409, "conflict", "x"), Conflict)
    assert isinstance(relay_error(502, "provider_error", "x"), RelayUnavailable)
