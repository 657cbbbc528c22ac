"""The wire protocol module against PROTOCOL.md's own examples, and against a hostile fake
agent on loopback: malformed frames, credit overruns and lying sizes."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from tether_sandbox import ProtocolError, TooLarge
from tether_sandbox._files import AsyncFiles
from tether_sandbox._protocol import (
    KIND_CONTROL,
    Connection,
    Message,
    Stream,
    decode_control,
    decode_frame,
    encode_control,
    encode_data,
    encode_window,
)

PROTOCOL_MD = Path(__file__).resolve().parents[3] / "proto" / "PROTOCOL.md"


def _doc_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", PROTOCOL_MD.read_text(), re.S)


def test_every_hex_example_decodes_and_reencodes() -> None:
    frames = [bytes.fromhex(b.replace("\n", " ")) for b in _doc_blocks("hex")]
    assert len(frames) >= 4
    for raw in frames:
        frame = decode_frame(raw)
        if frame.kind == KIND_CONTROL:
            message = decode_control(frame.payload)
            assert encode_control(message) == raw
        elif frame.kind == 1:
            assert encode_data(frame.stream, frame.channel, frame.payload) == raw
        else:
            assert encode_window(frame.stream, int.from_bytes(frame.payload, "big")) == raw


def test_every_json_example_is_a_control_message() -> None:
    for block in _doc_blocks("json"):
        for line in block.strip().splitlines() if block.count("\n{") else [block]:
            message = decode_control(line.encode())
            assert decode_control(encode_control(message)[6:]) == message


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"\x11\x00\x00", "truncated"),
        (b"\x21\x00\x00\x00\x01\x01x", "frame version"),
        (b"\x14\x00\x00\x00\x01\x01x", "kind"),
        (b"\x11\x00\x00\x00\x01\x03x", "channel"),
        (b"\x11\x00\x00\x00\x00\x01x", "stream 0"),
        (b"\x11\x00\x00\x00\x01\x01", "empty"),
        (b"\x12\x00\x00\x00\x01\x00\x00\x00\x00\x00", "credit"),
        (b"\x11\x00\x00\x00\x01\x01" + b"x" * ((1 << 20) + 1), "too large"),
    ],
)
def test_malformed_frames_are_refused(raw: bytes, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        decode_frame(raw)


Behaviour = Callable[[ServerConnection, Message], Awaitable[None]]


async def _fake_agent(behaviour: Behaviour) -> AsyncIterator[str]:
    async def handler(ws: ServerConnection) -> None:
        hello = decode_control(decode_frame(await ws.recv()).payload)  # type: ignore[arg-type]
        assert hello["type"] == "hello"
        await ws.send(
            encode_control(
                {"type": "welcome", "protocol": 1, "agent_version": "fake", "capabilities": []}
            )
        )
        async for raw in ws:
            frame = decode_frame(raw)  # type: ignore[arg-type]
            if frame.kind == KIND_CONTROL:
                message = decode_control(frame.payload)
                if message["type"] == "open":
                    await behaviour(ws, message)

    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/"


class _Direct:
    """Just enough of a sandbox for AsyncFiles: one direct connection to an agent."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    async def _open(self, op: str, fields: Message, *, window: int = 1 << 22) -> Stream:
        return await self.conn.open_stream(op, fields, window=window)


async def _files(url: str) -> tuple[Connection, AsyncFiles]:
    conn = await Connection.open(url, "token", "test")
    return conn, AsyncFiles(_Direct(conn))  # type: ignore[arg-type]


def _reply(stream: int, **fields: Any) -> bytes:
    return encode_control({"type": "reply", "stream": stream, **fields})


async def test_a_batch_that_lies_about_its_sizes_is_refused() -> None:
    async def lie(ws: ServerConnection, open_: Message) -> None:
        s = open_["stream"]
        await ws.send(_reply(s, reply="batch", results=[{"path": "a", "size": 3}]))
        await ws.send(encode_data(s, "out", b"0123456789"))  # 10 bytes, not 3
        await ws.send(encode_control({"type": "eof", "stream": s, "channel": "out"}))
        await ws.send(encode_control({"type": "closed", "stream": s}))

    async for url in _fake_agent(lie):
        conn, files = await _files(url)
        with pytest.raises(TooLarge):
            await files.read_batch(["a"])
        await conn.close()


async def test_a_read_larger_than_its_stat_is_capped() -> None:
    async def flood(ws: ServerConnection, open_: Message) -> None:
        s = open_["stream"]
        await ws.send(_reply(s, reply="stat", path="f", kind="file", size=1, mode=420, mtime_ms=0))
        for _ in range(40):
            await ws.send(encode_data(s, "out", b"x" * 65536))

    async for url in _fake_agent(flood):
        conn, files = await _files(url)
        with pytest.raises(TooLarge):
            await files.read("f", max_bytes=1 << 20)
        await conn.close()


async def test_a_credit_overrun_fails_the_stream_and_malformed_frames_are_dropped() -> None:
    async def overrun(ws: ServerConnection, open_: Message) -> None:
        s = open_["stream"]
        await ws.send(b"\x19garbage")  # malformed: logged and dropped, the connection lives
        await ws.send(_reply(s, reply="stat", path="f", kind="file", size=10, mode=420, mtime_ms=0))
        await ws.send(encode_data(s, "out", b"y" * 65536))  # the client granted 1000 bytes

    async for url in _fake_agent(overrun):
        conn = await Connection.open(url, "token", "test")
        stream = await conn.open_stream("read", {"path": "f"}, window=1000)
        first = await stream.recv()
        assert isinstance(first, dict) and first["reply"] == "stat"
        with pytest.raises(ProtocolError, match="overran"):
            await stream.recv()
        assert not conn.closed
        await conn.close()


async def test_a_reply_that_is_not_json_does_not_break_the_connection() -> None:
    async def nonsense(ws: ServerConnection, open_: Message) -> None:
        s = open_["stream"]
        await ws.send(b"\x13\x00\x00\x00\x00\x00{not json")
        await ws.send(_reply(s, reply="ok"))
        await ws.send(encode_control({"type": "closed", "stream": s}))

    async for url in _fake_agent(nonsense):
        conn, files = await _files(url)
        await asyncio.wait_for(files.mkdir("d"), 10)
        await conn.close()


def test_json_is_compact() -> None:
    assert json.loads(encode_control({"type": "cancel", "stream": 1})[6:]) == {
        "type": "cancel",
        "stream": 1,
    }
