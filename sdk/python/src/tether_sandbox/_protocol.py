"""The Tether wire protocol (``proto/PROTOCOL.md``): frames, the handshake, streams and credit
flow control. This is the only module that touches frames; the rest of the SDK opens a
:class:`Stream` for an operation and reads :class:`Data` and control messages from it.

Layout of a frame (section 5): one byte version/kind, a u32 stream id, one channel byte,
then the payload. Data frames carry raw bytes; control frames carry one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections import deque
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI

from ._constants import (
    CONNECT_TIMEOUT_S,
    DATA_CHUNK,
    FRAME_VERSION,
    HANDSHAKE_TIMEOUT_S,
    HEADER_LEN,
    INITIAL_WINDOW,
    MAX_PAYLOAD,
    MAX_QUEUED_CONTROLS,
    MAX_WINDOW,
    PING_INTERVAL_S,
    PING_TIMEOUT_S,
    PROTOCOL_VERSION,
)
from .errors import (
    ConnectionLost,
    ProtocolError,
    RelayUnreachable,
    TetherError,
    agent_error,
    relay_error,
)

log = logging.getLogger("tether_sandbox")


class _RedactCredentials(logging.Filter):
    """websockets logs the upgrade's headers at DEBUG; the API token must never reach a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg) + " ".join(str(a) for a in (record.args or ()))
        return "authorization" not in text.lower()


_ws_log = logging.getLogger("tether_sandbox.websocket")
_ws_log.addFilter(_RedactCredentials())

KIND_DATA = 1
KIND_WINDOW = 2
KIND_CONTROL = 3
CHANNELS = ("in", "out", "err")
_HEADER = struct.Struct(">BIB")
_CREDIT = struct.Struct(">I")
_MAX_STREAM_ID = 0xFFFF_FFFF


@dataclass(frozen=True)
class Data:
    """Bytes the agent sent on a stream's ``out`` or ``err`` channel."""

    channel: str
    data: bytes


Message = dict[str, Any]
"""A decoded control message (``{"type": ..., ...}``)."""


# --- frames -------------------------------------------------------------------------------


def encode_data(stream: int, channel: str, payload: bytes) -> bytes:
    """A data frame. The payload must be 1 to ``MAX_PAYLOAD`` bytes."""
    return _HEADER.pack((FRAME_VERSION << 4) | KIND_DATA, stream, CHANNELS.index(channel)) + payload


def encode_window(stream: int, credit: int) -> bytes:
    """A window frame granting ``credit`` bytes on ``stream``."""
    return _HEADER.pack((FRAME_VERSION << 4) | KIND_WINDOW, stream, 0) + _CREDIT.pack(credit)


def encode_control(message: Message) -> bytes:
    """A control frame holding ``message`` as compact JSON."""
    payload = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(
            f"the {message.get('op') or message.get('type')} request is {len(payload)} bytes "
            f"of JSON, over the protocol's {MAX_PAYLOAD}-byte limit; send less per request"
        )
    return _HEADER.pack((FRAME_VERSION << 4) | KIND_CONTROL, 0, 0) + payload


@dataclass(frozen=True)
class Frame:
    """A decoded frame: ``kind`` is data, window or control."""

    kind: int
    stream: int
    channel: str
    payload: bytes


def decode_frame(buf: bytes) -> Frame:
    """Checks a frame in the order of section 5 and decodes its header.

    Raises :class:`ProtocolError` naming the first rule broken.
    """
    if len(buf) < HEADER_LEN:
        raise ProtocolError(f"frame truncated: {len(buf)} bytes, a header is {HEADER_LEN}")
    if len(buf) - HEADER_LEN > MAX_PAYLOAD:
        raise ProtocolError(f"frame too large: {len(buf) - HEADER_LEN} payload bytes")
    first, stream, channel = _HEADER.unpack_from(buf)
    if first >> 4 != FRAME_VERSION:
        raise ProtocolError(f"unsupported frame version {first >> 4}")
    kind = first & 0x0F
    if kind not in (KIND_DATA, KIND_WINDOW, KIND_CONTROL):
        raise ProtocolError(f"unknown frame kind {kind}")
    if channel > 2:
        raise ProtocolError(f"unknown channel {channel}")
    payload = buf[HEADER_LEN:]
    if kind != KIND_CONTROL and stream == 0:
        raise ProtocolError("data or window frame on stream 0")
    if kind == KIND_DATA and not payload:
        raise ProtocolError(f"empty data frame on stream {stream}")
    if kind == KIND_WINDOW:
        if len(payload) != 4 or _CREDIT.unpack(payload)[0] == 0:
            raise ProtocolError(f"window frame on stream {stream} is not a credit of at least 1")
    return Frame(kind, stream, CHANNELS[channel], payload)


def decode_control(payload: bytes) -> Message:
    """Parses a control frame's payload: one JSON object with a string ``type``."""
    try:
        message = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"control message is not UTF-8 JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("control message is not a JSON object with a type")
    return message


# --- streams ------------------------------------------------------------------------------


class Stream:
    """One operation on a connection: what the agent sends on it, in order, and the client's
    side of its flow control.

    The agent's data is buffered up to the credit this stream granted (never more: an
    overrun cancels the stream), and credit is returned as :meth:`recv` hands data to the
    consumer, so a slow consumer slows the agent down instead of filling memory.
    """

    def __init__(self, conn: Connection, stream_id: int, window: int) -> None:
        self.id = stream_id
        self._conn = conn
        self._window = window
        self._outstanding = window  # credit the agent still holds
        self._consumed = 0  # bytes handed to the consumer since the last grant
        self._send_credit = INITIAL_WINDOW
        self._credit_changed = asyncio.Event()
        self._items: deque[Data | Message] = deque()
        self._ready = asyncio.Event()
        self._closed = False  # the agent sent `closed`
        self._failure: TetherError | None = None  # the connection broke first
        self._controls = 0  # control messages queued and not yet read

    # Called by the connection's reader.

    def _push(self, item: Data | Message) -> None:
        if isinstance(item, Data):
            self._outstanding -= len(item.data)
            if self._outstanding < 0:
                self._fail(
                    ProtocolError(f"the agent overran stream {self.id}'s credit; report a bug")
                )
                self._conn._send_nowait(encode_control({"type": "cancel", "stream": self.id}))
                return
        else:
            # Control messages are not flow-controlled (watch events above all); a consumer
            # that stopped reading must not let a chatty agent fill the host's memory.
            self._controls += 1
            if self._controls > MAX_QUEUED_CONTROLS:
                self._fail(
                    ProtocolError(
                        f"stream {self.id} queued over {MAX_QUEUED_CONTROLS} unread messages; "
                        "read its events as they come"
                    )
                )
                self._conn._send_nowait(encode_control({"type": "cancel", "stream": self.id}))
                return
        self._items.append(item)
        self._ready.set()

    def _grant(self, credit: int) -> None:
        # Senders cap what they accumulate (section 8), so a faulty grant cannot overflow.
        self._send_credit = min(self._send_credit + credit, 4 * _MAX_STREAM_ID)
        self._credit_changed.set()

    def _end(self) -> None:
        self._closed = True
        self._ready.set()
        self._credit_changed.set()

    def _fail(self, error: TetherError) -> None:
        if self._failure is None and not self._closed:
            self._failure = error
        self._ready.set()
        self._credit_changed.set()

    # The consumer's side.

    @property
    def finished(self) -> bool:
        """The agent closed the stream, or the connection broke, and everything was read."""
        return not self._items and (self._closed or self._failure is not None)

    async def recv(self) -> Data | Message | None:
        """The next thing the agent sent on this stream: :class:`Data` or a control message.

        Returns ``None`` after the stream's ``closed``. Raises :class:`ConnectionLost` when the
        connection broke before it.
        """
        while not self._items:
            if self._failure is not None:
                raise self._failure
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if not isinstance(item, Data):
            self._controls -= 1
        else:
            self._consumed += len(item.data)
            if self._consumed >= max(1, self._window // 2) and not self._closed:
                credit, self._consumed = self._consumed, 0
                self._outstanding += credit
                await self._conn._send(encode_window(self.id, credit))
        return item

    async def send(self, data: bytes | bytearray | memoryview) -> None:
        """Sends ``data`` on ``in``, in chunks of at most ``DATA_CHUNK`` and within credit."""
        view = memoryview(data)
        while view:
            while self._send_credit <= 0:
                if self._closed:
                    return  # the agent finished early (an error follows in the stream)
                if self._failure is not None:
                    raise self._failure
                self._credit_changed.clear()
                await self._credit_changed.wait()
            if self._closed:
                return
            n = min(len(view), DATA_CHUNK, self._send_credit)
            self._send_credit -= n
            await self._conn._send(encode_data(self.id, "in", bytes(view[:n])))
            view = view[n:]

    async def eof(self) -> None:
        """Ends the ``in`` channel (stdin or an upload)."""
        if not self._closed:
            await self._conn._send(
                encode_control({"type": "eof", "stream": self.id, "channel": "in"})
            )

    async def cancel(self) -> None:
        """Abandons the stream (section 7): a foreground process is killed, a background one
        detached, a transfer stopped. Harmless on a closed stream or a broken connection."""
        if not self._closed and self._failure is None:
            try:
                await self._conn._send(encode_control({"type": "cancel", "stream": self.id}))
            except ConnectionLost:
                pass

    async def signal(self, signal: str, *, group: bool = False) -> None:
        """Signals the stream's process (or its process group)."""
        await self._conn._send(
            encode_control({"type": "signal", "stream": self.id, "signal": signal, "group": group})
        )

    async def resize(self, cols: int, rows: int) -> None:
        """Resizes the stream's terminal."""
        await self._conn._send(
            encode_control({"type": "resize", "stream": self.id, "cols": cols, "rows": rows})
        )


def raise_if_error(message: Message) -> None:
    """Raises the typed exception for an ``error`` message on a stream."""
    if message.get("type") == "error":
        raise agent_error(str(message.get("code", "internal")), str(message.get("message", "")))


async def expect_reply(stream: Stream, kind: str) -> Message:
    """Reads a request/response stream to its end and returns its ``reply`` of ``kind``."""
    reply: Message | None = None
    while True:
        item = await stream.recv()
        if item is None:
            break
        if isinstance(item, Data):
            raise ProtocolError(f"unexpected data on a {kind} stream")
        raise_if_error(item)
        if item.get("type") == "reply":
            if item.get("reply") != kind:
                raise ProtocolError(f"expected a {kind} reply, got {item.get('reply')!r}")
            reply = item
    if reply is None:
        raise ProtocolError(f"the stream closed without a {kind} reply")
    return reply


# --- the connection -----------------------------------------------------------------------


class Connection:
    """One WebSocket to a sandbox's agent (directly or through the relay), after a successful
    handshake. Keeps reading the socket whatever its streams' consumers do, as section 8
    requires, and routes each frame to its stream."""

    def __init__(self, ws: ClientConnection, welcome: Message) -> None:
        self._ws = ws
        self.welcome = welcome
        self.capabilities: frozenset[str] = frozenset(welcome.get("capabilities") or ())
        self._streams: dict[int, Stream] = {}
        self._next_id = 1
        self._failure: TetherError | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._reader = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def open(cls, url: str, token: str | None, client: str) -> Connection:
        """Opens the WebSocket at ``url`` (``ws://`` or ``wss://``) and does the handshake."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            ws = await connect(
                url,
                additional_headers=headers,
                compression=None,
                max_size=2 * (HEADER_LEN + MAX_PAYLOAD),
                ping_interval=PING_INTERVAL_S,
                ping_timeout=PING_TIMEOUT_S,
                open_timeout=CONNECT_TIMEOUT_S,
                max_queue=64,
                user_agent_header=client,
                logger=_ws_log,
            )
        except InvalidStatus as exc:
            raise _upgrade_error(exc) from None
        except InvalidURI as exc:
            raise RelayUnreachable(f"{url} is not a WebSocket URL: {exc}") from None
        except (OSError, asyncio.TimeoutError) as exc:
            raise RelayUnreachable(
                f"cannot reach {_without_query(url)}: {exc}; is the relay running, and is "
                "TETHER_RELAY right?"
            ) from None
        try:
            await ws.send(
                encode_control({"type": "hello", "protocol": PROTOCOL_VERSION, "client": client})
            )
            raw = await asyncio.wait_for(ws.recv(), HANDSHAKE_TIMEOUT_S)
            if isinstance(raw, str):
                raise ProtocolError("the agent answered hello with a text message")
            frame = decode_frame(raw)
            if frame.kind != KIND_CONTROL:
                raise ProtocolError("the agent answered hello with a non-control frame")
            message = decode_control(frame.payload)
            raise_if_error(message)
            if message["type"] != "welcome" or message.get("protocol") != PROTOCOL_VERSION:
                raise ProtocolError(f"expected welcome for protocol 1, got {message!r:.200}")
        except ConnectionClosed as exc:
            raise ConnectionLost(f"the connection closed during the handshake: {exc}") from None
        except asyncio.TimeoutError:
            await ws.close()
            raise ConnectionLost(
                f"no welcome from the agent within {HANDSHAKE_TIMEOUT_S} s"
            ) from None
        except BaseException:
            await ws.close()
            raise
        return cls(ws, message)

    @property
    def closed(self) -> bool:
        """The connection is broken or closed; open a new one."""
        return self._failure is not None

    async def open_stream(
        self, op: str, fields: Message, *, window: int = INITIAL_WINDOW
    ) -> Stream:
        """Opens a new stream for ``op`` with the operation's ``fields``."""
        if self._failure is not None:
            raise self._failure
        window = max(1, min(window, MAX_WINDOW))
        stream_id = self._next_id
        while stream_id in self._streams or stream_id == 0:
            stream_id = stream_id % _MAX_STREAM_ID + 1
        self._next_id = stream_id % _MAX_STREAM_ID + 1
        stream = Stream(self, stream_id, window)
        self._streams[stream_id] = stream
        message = {"type": "open", "stream": stream_id, "op": op, **fields}
        if window != INITIAL_WINDOW:
            message["window"] = window
        try:
            await self._send(encode_control(message))
        except BaseException:
            self._streams.pop(stream_id, None)
            raise
        return stream

    async def close(self) -> None:
        """Closes the WebSocket (code 1000); every open stream ends with ConnectionLost."""
        if self._failure is None:
            self._failure = ConnectionLost("the connection was closed by this client")
        await self._ws.close()
        self._reader.cancel()
        for stream in list(self._streams.values()):
            stream._fail(self._failure)
        self._streams.clear()

    def abort(self) -> None:
        """Drops the TCP connection at once, without a close handshake."""
        self._ws.transport.abort()

    async def _send(self, frame: bytes) -> None:
        if self._failure is not None:
            raise self._failure
        try:
            await self._ws.send(frame)
        except ConnectionClosed as exc:
            raise ConnectionLost(f"the connection to the sandbox closed: {exc}") from None

    def _send_nowait(self, frame: bytes) -> None:
        # For the reader, which must never wait on the socket's writes.
        task = asyncio.get_running_loop().create_task(self._send_quietly(frame))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send_quietly(self, frame: bytes) -> None:
        try:
            await self._send(frame)
        except TetherError:
            pass

    async def _read_loop(self) -> None:
        reason: TetherError
        try:
            async for raw in self._ws:
                if isinstance(raw, str):
                    log.warning("ignoring a text message from the agent")
                    continue
                try:
                    self._dispatch(raw)
                except ProtocolError as exc:
                    # Section 6: a client logs a malformed frame and goes on; no one answers
                    # an error with an error.
                    log.warning("dropping a malformed frame from the agent: %s", exc)
            reason = ConnectionLost("the sandbox closed the connection")
        except ConnectionClosed as exc:
            reason = ConnectionLost(f"the connection to the sandbox broke: {exc}")
        except asyncio.CancelledError:
            return
        if self._failure is None:
            self._failure = reason
        for stream in list(self._streams.values()):
            stream._fail(self._failure)
        self._streams.clear()

    def _dispatch(self, raw: bytes) -> None:
        frame = decode_frame(raw)
        if frame.kind == KIND_CONTROL:
            message = decode_control(frame.payload)
            stream_id = message.get("stream")
            if not isinstance(stream_id, int) or stream_id == 0:
                if message["type"] == "error":
                    # A refused message (section 11): it changes nothing else.
                    log.debug("agent refused a message: %s", message.get("message"))
                else:
                    log.debug("ignoring a %s message without a stream", message["type"])
                return
            stream = self._streams.get(stream_id)
            if stream is None:
                log.debug(
                    "ignoring %s for stream %d, which is not open", message["type"], stream_id
                )
                return
            if message["type"] == "closed":
                del self._streams[stream_id]
                stream._end()
            else:
                stream._push(message)
            return
        stream = self._streams.get(frame.stream)
        if stream is None:
            return  # crossed a cancel on the wire
        if frame.kind == KIND_WINDOW:
            stream._grant(_CREDIT.unpack(frame.payload)[0])
        elif frame.channel == "in":
            stream._fail(
                ProtocolError(f"the agent sent data on channel in of stream {frame.stream}")
            )
            self._send_nowait(encode_control({"type": "cancel", "stream": frame.stream}))
        else:
            stream._push(Data(frame.channel, frame.payload))


def _upgrade_error(exc: InvalidStatus) -> TetherError:
    """Maps the relay's refusal of the WebSocket upgrade (section 15)."""
    status = exc.response.status_code
    code, message = "", ""
    try:
        body = json.loads(exc.response.body or b"{}")
        code = str(body["error"]["code"])
        message = str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = (exc.response.body or b"").decode("utf-8", "replace")[:500]
    return relay_error(
        status, code, message or f"the relay refused the connection with HTTP {status}"
    )


def _without_query(url: str) -> str:
    return url.split("?", 1)[0]
