"""The portal: one event loop on a daemon thread, shared by every blocking object of the
process, and the two ways into it (a call, an iteration)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class _Portal:
    """An event loop on a daemon thread, shared by every sync object of the process."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def loop(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="tether-sandbox-loop", daemon=True
                )
                thread.start()
                cls._loop = loop
            return cls._loop


def _call(coro: Coroutine[Any, Any, T]) -> T:
    loop = _Portal.loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError(
            "a blocking Sandbox call from inside its own callback would deadlock; "
            "use AsyncSandbox in async code"
        )
    future: Future[T] = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


def _iterate(aiter: AsyncIterator[T]) -> Iterator[T]:
    async def step() -> tuple[bool, T | None]:
        try:
            return True, await aiter.__anext__()
        except StopAsyncIteration:
            return False, None

    while True:
        more, item = _call(step())
        if not more:
            return
        yield item  # type: ignore[misc]
