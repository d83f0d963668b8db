"""What wakes a NATS consumer's waiting fetch: :class:`Changes`."""

from __future__ import annotations

import asyncio


class Changes:
    """An :class:`asyncio.Event` for one loop whose timed wait costs a future and a timer.

    ``asyncio.wait_for(event.wait(), timeout)`` wraps the wait in a task of its own; a fetch
    waits once per message it hands out (a runner fetches one at a time), so the task was a
    good part of what a fetch cost. Used on its loop only.

    Args:
        loop: the loop every call is made on.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._set = False
        self._waiters: list[asyncio.Future[None]] = []

    def set(self) -> None:
        """Mark a change and wake every waiter."""
        self._set = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            _wake(waiter)

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    async def wait(self, timeout: float) -> None:
        """Return once set, or after ``timeout`` seconds."""
        if self._set:
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append(waiter)
        timer = self._loop.call_later(timeout, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            if waiter in self._waiters:  # cancelled, or timed out
                self._waiters.remove(waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
