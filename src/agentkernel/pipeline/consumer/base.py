"""What a queue consumer is: the :class:`QueueConsumer` base and the handler callables it gives."""

from __future__ import annotations

import asyncio
import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any

from agentkernel.pipeline.envelope import QueueMessage

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


class QueueConsumer(ABC):
    """A component that consumes one queue (Agent Runner, response handler, Lambda consumers).

    Subclasses say what to do with a message and what to do when it keeps failing. ``poll`` and
    ``delete_message`` are for consumers that drive a broker themselves; push-driven ones (an SQS
    event source mapping on Lambda) leave them unimplemented.
    """

    @abstractmethod
    def process_message(self, message: QueueMessage) -> Any:
        """Handle one message (may be ``async``); raising makes it be delivered again."""

    @abstractmethod
    def on_permanent_failure(self, message: QueueMessage) -> Any:
        """Answer the caller of a message that exhausted its deliveries (may be ``async``)."""

    def poll(self, batch_size: int = 1, wait_seconds: float = 1.0) -> list[QueueMessage]:
        """Fetch messages from the broker; not available on push-driven consumers."""
        raise NotImplementedError(f"{type(self).__name__} does not poll")

    def delete_message(self, message: QueueMessage) -> None:
        """Remove a handled message from the broker; not available on push-driven consumers."""
        raise NotImplementedError(f"{type(self).__name__} does not delete messages")
