"""Ports inside the sandbox: which listen, their preview URLs (through the relay), and local
forwards (a TCP listener on the host whose connections reach the port over the WebSocket)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from ._preview import fetchable, with_token
from ._protocol import Data, expect_reply, raise_if_error
from .errors import ProtocolError, TetherError
from .types import ListeningPort

if TYPE_CHECKING:
    from ._sandbox import AsyncSandbox

log = logging.getLogger("tether_sandbox")


class AsyncForward:
    """A host port forwarded to a port inside the sandbox. :meth:`close` to stop."""

    def __init__(self, server: asyncio.Server, local_port: int, remote_port: int) -> None:
        self._server = server
        self.local_port = local_port
        self.remote_port = remote_port
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:LOCAL_PORT``."""
        return f"http://127.0.0.1:{self.local_port}"

    async def close(self) -> None:
        """Stops listening and closes every forwarded connection."""
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._server.wait_closed()


class AsyncPorts:
    """``sandbox.ports``: network ports inside the sandbox."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def list(self) -> list[ListeningPort]:
        """The TCP ports listening inside the sandbox."""
        reply = await expect_reply(await self._sandbox._open("ports", {}), "ports")
        raw = reply.get("ports")
        if not isinstance(raw, list):
            raise ProtocolError("the ports reply lacks its list")
        ports = []
        for p in raw:
            if not isinstance(p, dict) or not isinstance(p.get("port"), int):
                raise ProtocolError("a listening port is malformed")
            ports.append(ListeningPort(int(p["port"]), str(p.get("address", ""))))
        return ports

    async def preview_url(self, port: int) -> str:
        """A URL that reaches ``port`` inside the sandbox through the relay, carrying the
        sandbox's preview token: one that httpx, requests, urllib, fetch and curl on this
        machine can fetch, and a browser can open. That is the host form
        (``http://PORT-ID.localhost:...``, its own origin) when this machine's resolver
        resolves its name to loopback, the path form (``http://relay/preview/ID/PORT/``, the
        relay's origin) otherwise; :meth:`preview_urls` gives both. The URL is a credential for
        the sandbox's previews: keep it out of logs."""
        return await fetchable(*await self.preview_urls(port))

    async def preview_urls(self, port: int) -> tuple[str, str]:
        """The preview URL of ``port`` by host name (``http://PORT-ID.localhost:...``) and by
        path (``http://relay/preview/ID/PORT/``), each carrying the preview token."""
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is not a TCP port")
        info = await self._sandbox._relay.preview(self._sandbox.id)
        return (
            with_token(info.host_url, port, info.token),
            with_token(info.path_url, port, info.token),
        )

    async def forward(
        self, port: int, *, local_port: int = 0, host: str = "127.0.0.1"
    ) -> AsyncForward:
        """Listens on ``127.0.0.1:local_port`` (0: any free port) and carries each connection
        to ``host:port`` as seen from inside the sandbox."""

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            forward._tasks.add(task)
            try:
                await self._carry(reader, writer, port, host)
            except (TetherError, OSError) as exc:
                log.info("forward to port %d ended: %s", port, exc)
            finally:
                forward._tasks.discard(task)
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

        server = await asyncio.start_server(serve, "127.0.0.1", local_port)
        bound = server.sockets[0].getsockname()[1]
        forward = AsyncForward(server, bound, port)
        return forward

    async def _carry(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int, host: str
    ) -> None:
        stream = await self._sandbox._open("connect", {"port": port, "host": host})

        async def upstream() -> None:
            while chunk := await reader.read(1 << 16):
                await stream.send(chunk)
            await stream.eof()

        up = asyncio.get_running_loop().create_task(upstream())
        try:
            while (item := await stream.recv()) is not None:
                if isinstance(item, Data):
                    writer.write(item.data)
                    await writer.drain()
                    continue
                raise_if_error(item)
                if item.get("type") == "eof" and writer.can_write_eof():
                    writer.write_eof()
        finally:
            up.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await up
            await stream.cancel()
