"""Streams (sections 7 and 8): one operation's messages in order, and the client's side of
its credit flow control in both directions."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from .._constants import DATA_CHUNK, INITIAL_WINDOW, MAX_QUEUED_CONTROLS
from ..errors import ConnectionLost, ProtocolError, TetherError, agent_error
from .frames import MAX_STREAM_ID, Data, Message, encode_control, encode_data, encode_window

if TYPE_CHECKING:
    from .connection import Connection


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
        self._send_credit = min(self._send_credit + credit, 4 * MAX_STREAM_ID)
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
