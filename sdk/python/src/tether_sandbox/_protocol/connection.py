"""The connection (sections 2 to 4, 12, 15): the WebSocket, the handshake, and the reader
that routes every frame to its stream and never waits on a consumer."""

from __future__ import annotations

import asyncio
import json
import logging

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI

from .._constants import (
    CONNECT_TIMEOUT_S,
    HANDSHAKE_TIMEOUT_S,
    HEADER_LEN,
    INITIAL_WINDOW,
    MAX_PAYLOAD,
    MAX_WINDOW,
    PING_INTERVAL_S,
    PING_TIMEOUT_S,
    PROTOCOL_VERSION,
)
from ..errors import ConnectionLost, ProtocolError, RelayUnreachable, TetherError, relay_error
from .frames import (
    CREDIT,
    KIND_CONTROL,
    KIND_WINDOW,
    MAX_STREAM_ID,
    Data,
    Message,
    decode_control,
    decode_frame,
    encode_control,
)
from .stream import Stream, raise_if_error

log = logging.getLogger("tether_sandbox")


class _RedactCredentials(logging.Filter):
    """websockets logs the upgrade's headers at DEBUG; the API token must never reach a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg) + " ".join(str(a) for a in (record.args or ()))
        return "authorization" not in text.lower()


_ws_log = logging.getLogger("tether_sandbox.websocket")
_ws_log.addFilter(_RedactCredentials())


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
            stream_id = stream_id % MAX_STREAM_ID + 1
        self._next_id = stream_id % MAX_STREAM_ID + 1
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
            stream._grant(CREDIT.unpack(frame.payload)[0])
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
