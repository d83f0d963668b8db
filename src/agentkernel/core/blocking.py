"""Run a call from async code: inline when it cannot block, on a worker thread otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def call(nonblocking: bool, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, without a thread hop when ``nonblocking`` (in-process backends)."""
    if nonblocking:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


def nonblocking_async(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """An ``async`` wrapper that runs ``fn``, which never blocks, on the event loop itself."""

    async def run(*args: Any) -> T:
        return fn(*args)

    return run
