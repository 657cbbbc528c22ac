"""Processes: run to completion, streaming, stdin, env/cwd/user, signals, timeouts, output
caps, background processes and re-attaching."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from conftest import RelayProcess
from tether_sandbox import (
    AsyncSandbox,
    CommandFailed,
    NotFound,
    OutputChunk,
    Sandbox,
    SandboxGone,
    SandboxNotFound,
)


def test_run_to_completion(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("printf 'hi\\n'; printf oops >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code) == ("hi\n", "oops", 3)
    assert not r.timed_out and not r.truncated
    assert r.output_bytes in (b"hi\noops", b"oopshi\n")


def test_argv_is_not_a_shell(sandbox: Sandbox) -> None:
    r = sandbox.commands.run(["echo", "$HOME; exit 1"])
    assert (r.stdout, r.exit_code) == ("$HOME; exit 1\n", 0)


def test_missing_program_is_not_found(sandbox: Sandbox) -> None:
    with pytest.raises(NotFound):
        sandbox.commands.run(["/no/such/program"])


def test_hundred_megabytes_of_binary_output_byte_exact(sandbox: Sandbox) -> None:
    r = sandbox.commands.run(
        "head -c 100000000 /dev/urandom > /tmp/blob && sha256sum /tmp/blob >&2 && cat /tmp/blob"
    )
    assert r.exit_code == 0, r.stderr
    assert len(r.stdout_bytes) == 100_000_000
    assert hashlib.sha256(r.stdout_bytes).hexdigest() == r.stderr.split()[0]


def test_timeout_gives_124(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("echo started; sleep 30", timeout=0.5)
    assert r.exit_code == 124 and r.timed_out
    assert r.stdout == "started\n"


def test_output_limit_truncates(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("head -c 1000000 /dev/zero; echo done >&2", output_limit=1000)
    assert r.truncated and r.exit_code == 0
    assert len(r.stdout_bytes) + len(r.stderr_bytes) == 1000


def test_stdin_env_cwd_user(sandbox: Sandbox) -> None:
    data = bytes(range(256)) * 40_000  # 10 MB through stdin, past every window
    r = sandbox.commands.run("sha256sum", stdin=data)
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    r = sandbox.commands.run(
        "echo $GREETING; pwd; id -u", env={"GREETING": "hey"}, cwd="/tmp", user=1000
    )
    assert r.stdout.split() == ["hey", "/tmp", "1000"]


def test_check_raises_command_failed(sandbox: Sandbox) -> None:
    with pytest.raises(CommandFailed) as err:
        sandbox.commands.run("echo bad >&2; exit 7", check=True)
    assert err.value.exit_code == 7 and err.value.stderr == "bad\n"


def test_streaming_callbacks(sandbox: Sandbox) -> None:
    out: list[bytes] = []
    err: list[bytes] = []
    r = sandbox.commands.run(
        "for i in 1 2 3; do echo $i; echo e$i >&2; done", on_stdout=out.append, on_stderr=err.append
    )
    assert b"".join(out) == b"1\n2\n3\n" and b"".join(err) == b"e1\ne2\ne3\n"
    assert r.stdout == "1\n2\n3\n"


def test_streaming_iterator_with_interactive_stdin(sandbox: Sandbox) -> None:
    h = sandbox.commands.start("while read line; do echo got $line; done", stdin=True)
    h.send_stdin("one\n")
    chunks = iter(h)
    first: OutputChunk = next(chunks)
    assert first.stream == "stdout" and first.data == b"got one\n" and first.offset == 0
    h.send_stdin("two\n")
    h.close_stdin()
    r = h.wait()
    assert r.exit_code == 0 and r.stdout == "got one\ngot two\n"


def test_signal_a_process(sandbox: Sandbox) -> None:
    h = sandbox.commands.start(
        "trap 'echo term; exit 5' TERM; echo ready; while :; do sleep 0.05; done"
    )
    assert next(iter(h)).data == b"ready\n"
    h.signal("TERM")
    r = h.wait()
    assert r.exit_code == 5 and "term" in r.stdout


def test_background_list_wait_kill(sandbox: Sandbox) -> None:
    h = sandbox.commands.start("echo working; sleep 30", background=True, tag="job")
    assert next(iter(h)).data == b"working\n"
    h.detach()
    procs = {p.process_id: p for p in sandbox.commands.list()}
    assert procs[h.process_id].tag == "job" and procs[h.process_id].running
    again = sandbox.commands.attach(h.process_id)
    assert next(iter(again)).data == b"working\n"  # replayed from offset 0
    sandbox.commands.kill(h.process_id)
    status = again.wait().status
    assert status.signal == 9 and status.exit_code == 137


async def test_background_output_survives_a_dropped_connection(asandbox: AsyncSandbox) -> None:
    # 200 numbered lines, paced so the drop lands in the middle of the output.
    h = await asandbox.commands.start(
        "i=0; while [ $i -lt 200 ]; do echo line-$i; i=$((i+1)); sleep 0.005; done",
        background=True,
    )
    seen = bytearray()
    dropped = False
    async for chunk in h:
        seen += chunk.data
        if not dropped and seen.count(b"\n") >= 20:
            conn = asandbox._conn
            assert conn is not None
            conn.abort()  # the TCP connection dies, as behind a flaky proxy
            dropped = True
    assert dropped
    result = await h.wait()
    assert result.exit_code == 0
    assert bytes(seen) == b"".join(b"line-%d\n" % i for i in range(200))
    assert h.dropped == []


async def test_async_run_and_iterate(asandbox: AsyncSandbox) -> None:
    r = await asandbox.commands.run("echo async")
    assert r.stdout == "async\n"
    h = await asandbox.commands.start("echo a; echo b >&2")
    chunks = [c async for c in h]
    assert sorted((c.stream, c.data) for c in chunks) == [("stderr", b"b\n"), ("stdout", b"a\n")]
    assert (await h.wait()).exit_code == 0


def test_kill_reaches_a_process_from_another_connection(sandbox: Sandbox) -> None:
    h = sandbox.commands.start("sleep 30")
    other = Sandbox.connect(sandbox.id)
    try:
        other.commands.kill(h.process_id, signal="TERM", group=False)
    finally:
        other.close()
    assert h.wait().status.signal == 15


def test_a_gap_in_the_replay_ring_is_reported(sandbox: Sandbox) -> None:
    # 64 KiB rings, 200 KiB of output while nobody is attached: the oldest bytes are gone.
    h = sandbox.commands.start(
        "head -c 204800 /dev/zero | tr '\\0' x; echo; read _",
        background=True,
        stdin=True,
        ring_bytes=65536,
    )
    h.detach()
    # Wait (by the process list) until all the output is produced, then re-attach from 0.
    for _ in range(1000):
        proc = next(p for p in sandbox.commands.list() if p.process_id == h.process_id)
        if proc.out_offset == 204801:
            break
    again = sandbox.commands.attach(h.process_id, stdin=True)
    again.close_stdin()
    result = again.wait()
    assert again.dropped == [("stdout", 0, 204801 - 65536)]
    assert len(result.stdout_bytes) == 65536 and again.offsets[0] == 204801


def test_a_command_in_a_deleted_sandbox_fails_clearly(sandbox: Sandbox) -> None:
    other = Sandbox.connect(sandbox.id)
    other.delete()
    with pytest.raises((SandboxNotFound, SandboxGone)):
        sandbox.commands.run("true")


async def test_a_stalled_stream_does_not_stall_the_others(asandbox: AsyncSandbox) -> None:
    # 50 MB nobody reads: its window fills and the agent holds that process back...
    stalled = await asandbox.commands.start("head -c 50000000 /dev/zero")
    # ...while 20 other commands on the same connection run to completion.
    results = await asyncio.gather(*(asandbox.commands.run(f"echo {i}") for i in range(20)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(20)]
    assert len((await stalled.wait()).stdout_bytes) == 50_000_000


async def test_background_output_survives_a_relay_restart(tmp_path: Path) -> None:
    # A relay of its own, restarted on the same address and data directory mid-output.
    relay = RelayProcess(tmp_path)
    listen = relay.url.removeprefix("http://")
    sb = await AsyncSandbox.create(ttl=600, relay=relay.url, token=relay.token)
    try:
        h = await sb.commands.start(
            "i=0; while [ $i -lt 300 ]; do echo line-$i; i=$((i+1)); sleep 0.01; done",
            background=True,
        )
        seen = bytearray()
        restarted = False
        async for chunk in h:
            seen += chunk.data
            if not restarted and seen.count(b"\n") >= 20:
                relay.stop()
                relay = RelayProcess(tmp_path, listen)
                restarted = True
        assert restarted and (await h.wait()).exit_code == 0
        assert bytes(seen) == b"".join(b"line-%d\n" % i for i in range(300))
    finally:
        await sb.delete()
        relay.stop()
