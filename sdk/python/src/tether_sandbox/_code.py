"""Code: one-shot ``run_code`` in python, node or bash, and the stateful Python session,
which keeps a small driver process (``_code_driver.py``) running in the sandbox and talks to
it over its stdin and stdout."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

from ._commands import AsyncCommandHandle
from ._constants import CODE_DRIVER_DIR, CODE_REPLY_MAX
from .errors import CodeSessionError, CommandTimeout, ConnectionLost, TetherError
from .types import CodeError, CodeResult

if TYPE_CHECKING:
    from ._sandbox import AsyncSandbox

INTERRUPT_GRACE_S = 5.0  # seconds a cell gets to stop after SIGINT before the session dies
_STDERR_TAIL = 64 << 10  # 64 KiB of the driver's own stderr kept for error messages
_MAX_UNREAD_REPLIES = 64  # replies queued before the oldest is dropped

_INTERPRETERS = {"python": ["python3", "-"], "node": ["node", "-"], "bash": ["bash", "-s"]}


def run_code_fields(language: str) -> list[str]:
    """The argv that reads a program of ``language`` from stdin."""
    try:
        return list(_INTERPRETERS[language])
    except KeyError:
        raise ValueError(
            f"unknown language {language!r}; run_code speaks {', '.join(_INTERPRETERS)}"
        ) from None


def _driver_source() -> bytes:
    return resources.files(__package__ or "tether_sandbox").joinpath("_code_driver.py").read_bytes()


class AsyncCodeSession:
    """A Python interpreter that lives across calls: variables, imports and functions
    defined by one :meth:`run` are there for the next."""

    def __init__(self, handle: AsyncCommandHandle) -> None:
        self._handle = handle
        self._next_id = 1
        self._replies: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._stderr = bytearray()
        self._lock = asyncio.Lock()
        self._pending: bytes | None = None  # the request awaiting its reply
        handle.on_reattach = self._resend
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def process_id(self) -> int:
        return self._handle.process_id

    @classmethod
    async def start(
        cls,
        sandbox: AsyncSandbox,
        *,
        python: str = "python3",
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> AsyncCodeSession:
        source = _driver_source()
        path = f"{CODE_DRIVER_DIR}/driver-{hashlib.sha256(source).hexdigest()[:16]}.py"
        await sandbox.files.write(path, source, mode=0o644)
        handle = await sandbox.commands.start(
            [python, "-u", path],
            background=True,
            tag="tether-code-session",
            stdin=True,
            env=env,
            cwd=cwd,
            collect=False,
        )
        return cls(handle)

    async def _read(self) -> None:
        line = bytearray()
        try:
            async for chunk in self._handle:
                if chunk.stream == "stderr":
                    self._stderr += chunk.data
                    del self._stderr[:-_STDERR_TAIL]
                    continue
                line += chunk.data
                while (nl := line.find(b"\n")) >= 0:
                    raw, line = bytes(line[:nl]), line[nl + 1 :]
                    if self._replies.qsize() >= _MAX_UNREAD_REPLIES:
                        # Replies nobody asked for (a hostile or broken driver): keep memory
                        # bounded by dropping the oldest.
                        self._replies.get_nowait()
                    self._replies.put_nowait(self._parse(raw))
                if len(line) > CODE_REPLY_MAX:
                    raise CodeSessionError("the code session's reply is over its size limit")
        except TetherError as exc:
            self._stderr += f"\n{exc}".encode()
        finally:
            self._replies.put_nowait(None)

    def _parse(self, raw: bytes) -> dict[str, Any]:
        try:
            reply = json.loads(raw)
        except ValueError:
            return {"invalid": raw[:200].decode("utf-8", "replace")}
        return reply if isinstance(reply, dict) else {"invalid": "not an object"}

    async def run(self, code: str, *, timeout: float | None = None) -> CodeResult:
        """Runs ``code`` in the session. A Python exception comes back in ``result.error``
        (the session lives on); past ``timeout`` seconds the cell is interrupted and
        :class:`CommandTimeout` raised, with the session's state kept."""
        # A bad timeout fails here, before the cell is sent and runs with nobody waiting.
        timeout = None if timeout is None else float(timeout)
        async with self._lock:
            request_id = self._next_id
            self._next_id += 1
            self._pending = (json.dumps({"id": request_id, "code": code}) + "\n").encode()
            try:
                await self._handle.send_stdin(self._pending)
            except ConnectionLost:
                pass  # the handle re-attaches and _resend sends it again
            try:
                reply = await asyncio.wait_for(self._reply(request_id), timeout)
            except asyncio.TimeoutError:
                await self._handle.signal("INT")
                try:
                    await asyncio.wait_for(self._reply(request_id), INTERRUPT_GRACE_S)
                except asyncio.TimeoutError:
                    await self.close()
                    raise CommandTimeout(
                        f"the cell ran past {timeout} s and ignored the interrupt; "
                        "the session was closed"
                    ) from None
                raise CommandTimeout(
                    f"the cell ran past {timeout} s and was interrupted; the session lives on"
                ) from None
            finally:
                self._pending = None
            return self._result(reply, request_id)

    async def _reply(self, request_id: int) -> dict[str, Any] | None:
        # Earlier ids are replays of replies already taken (a re-attach replays output).
        while True:
            reply = await self._replies.get()
            if reply is None or "invalid" in reply or reply.get("id", request_id) >= request_id:
                return reply

    async def _resend(self) -> None:
        """After a reconnect: the request may never have reached the driver, so send it
        again; the driver answers a repeated id with its stored reply, without re-running."""
        if self._pending is not None:
            await self._handle.send_stdin(self._pending)

    def _result(self, reply: dict[str, Any] | None, request_id: int) -> CodeResult:
        if reply is None:
            tail = self._stderr.decode("utf-8", "replace").strip()[-2000:]
            raise CodeSessionError(f"the code session's driver exited: {tail or 'no output'}")
        if "invalid" in reply or reply.get("id") != request_id:
            raise CodeSessionError(f"the code session's driver answered nonsense: {reply!r:.200}")
        err = reply.get("error")
        error = None
        if isinstance(err, dict):
            tb = err.get("traceback")
            error = CodeError(
                name=str(err.get("name", "")),
                value=str(err.get("value", "")),
                traceback=[str(t) for t in tb] if isinstance(tb, list) else [],
            )
        images: list[bytes] = []
        for img in reply.get("images") or []:
            try:
                images.append(base64.b64decode(str(img), validate=True))
            except (binascii.Error, ValueError):
                raise CodeSessionError(
                    "the code session sent an image that is not base64"
                ) from None
        # Chart data is the sandbox's word: kept only as JSON objects (the reply's size is
        # already capped), never interpreted here.
        charts = [c for c in reply.get("charts") or [] if isinstance(c, dict)]
        value = reply.get("value")
        return CodeResult(
            stdout=str(reply.get("stdout") or ""),
            stderr=str(reply.get("stderr") or ""),
            value=None if value is None else str(value),
            error=error,
            images=images,
            charts=charts,
        )

    async def close(self) -> None:
        """Ends the session's process."""
        with contextlib.suppress(TetherError):
            await self._handle.kill()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, TetherError):
            await self._reader
