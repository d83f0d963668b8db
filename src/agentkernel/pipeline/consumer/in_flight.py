"""What a consumer loop has in flight: free places shared by its threads, messages per thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future

from agentkernel.pipeline.runtime.event_loop import resolve_soon
from agentkernel.pipeline.wire.envelope import QueueMessage

#: The handling of one message: a task of the tracker's loop, or a thread-safe future of one.
Handling = asyncio.Future[None] | Future[None]


class Slots:
    """Counts free in-flight places shared by all consumer threads of a loop."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._cond = threading.Condition()
        self._wakers: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def take(self, wanted: int, timeout: float) -> int:
        """Take up to ``wanted`` places, waiting at most ``timeout`` seconds for one."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._free > 0, timeout):
                return 0
            taken = min(wanted, self._free)
            self._free -= taken
            return taken

    async def wait_async(self, timeout: float) -> None:
        """From an event loop: wait up to ``timeout`` seconds until a place may be free."""
        loop = asyncio.get_running_loop()
        waker: asyncio.Future[None] = loop.create_future()
        with self._cond:
            if self._free > 0:
                return
            self._wakers.append((loop, waker))
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waker, timeout)
        finally:
            with self._cond:
                if (loop, waker) in self._wakers:
                    self._wakers.remove((loop, waker))

    def give(self, count: int = 1) -> None:
        if count:
            with self._cond:
                self._free += count
                self._cond.notify_all()
                wakers, self._wakers = self._wakers, []
            for loop, waker in wakers:
                resolve_soon(loop, waker)

    def place(self) -> Callable[[], None]:
        """A release of one taken place that frees it once, however often it is called."""
        once = threading.Lock()  # held by the first release: one allocation per message

        def release() -> None:
            if once.acquire(blocking=False):
                self.give()

        return release


class Tracker:
    """Messages a consumer thread has handed out and not yet settled.

    Args:
        loop: the event loop their handling runs on.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._messages: dict[int, QueueMessage] = {}
        self._handlings: dict[int, Handling] = {}
        self._cond = threading.Condition()

    def add(self, message: QueueMessage) -> None:
        with self._cond:
            self._messages[id(message)] = message

    def attach(self, message: QueueMessage, handling: Handling) -> None:
        """Remember the handling of ``message``: a task of :attr:`loop`, or a thread-safe
        future of one."""
        with self._cond:
            if id(message) in self._messages:
                self._handlings[id(message)] = handling

    def done(self, message: QueueMessage) -> None:
        with self._cond:
            self._messages.pop(id(message), None)
            self._handlings.pop(id(message), None)
            self._cond.notify_all()

    def cancel(self, message: QueueMessage) -> None:
        """Cancel the handling of ``message``, if any (from any thread)."""
        with self._cond:
            handling = self._handlings.get(id(message))
        if isinstance(handling, asyncio.Future):
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing runs there
                self.loop.call_soon_threadsafe(handling.cancel)
        elif handling is not None:
            handling.cancel()

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every message to be settled; ``False`` if not."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._messages, timeout)

    def pending(self) -> list[QueueMessage]:
        with self._cond:
            return list(self._messages.values())
