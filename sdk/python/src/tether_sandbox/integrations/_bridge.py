"""Running the SDK's coroutines from framework code: blocking from any thread, or awaited from
any event loop.

The SDK keeps each sandbox's WebSocket on one private event loop (the sync API's portal).
Framework code calls adapters either synchronously from worker threads or asynchronously from
its own loop; both hand the coroutine to the portal, so one async implementation serves both
and an async caller never ties up a thread while it waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from .._sync import _call, _Portal

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Runs ``coro`` on the SDK's loop and blocks until it finishes."""
    return _call(coro)


async def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Runs ``coro`` on the SDK's loop and awaits it from the caller's loop."""
    loop = _Portal.loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))
