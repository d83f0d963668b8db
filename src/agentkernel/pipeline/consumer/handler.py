"""The callables a consumer hands each message to, and the one way to await either kind."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from agentkernel.pipeline.wire.envelope import QueueMessage

Handler = Callable[[QueueMessage], Any] | Callable[[QueueMessage], Awaitable[Any]]


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """True for ``async def`` functions, bound methods and partials of them."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    )


def as_async(fn: Handler) -> Callable[[QueueMessage], Awaitable[Any]]:
    """``fn`` as an async callable: a sync one runs on a worker thread (it may block)."""
    if is_async_callable(fn):
        return fn

    async def in_thread(message: QueueMessage) -> None:
        result = await asyncio.to_thread(fn, message)
        if inspect.isawaitable(result):  # a sync callable that returned a coroutine
            await result

    return in_thread
