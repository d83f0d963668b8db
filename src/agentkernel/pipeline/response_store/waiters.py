"""Wake asyncio waiters from any thread when the record they wait for is written."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from agentkernel.pipeline.runtime.event_loop import resolve_soon


class WaiterRegistry:
    """Futures waiting for a request id, each resolved on its own event loop.

    A notification may carry a value (the reply itself, when the store sends it along); each
    future it wakes is resolved with it.
    """

    def __init__(self) -> None:
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]]] = (
            defaultdict(list)
        )
        self._lock = threading.Lock()

    @contextmanager
    def waiting(self, request_id: str) -> Iterator[asyncio.Future[Any]]:
        """Register a future for ``request_id`` for the duration of the block."""
        future = self.add(request_id)
        try:
            yield future
        finally:
            self.discard(request_id, future)

    def add(self, request_id: str) -> asyncio.Future[Any]:
        """Register a future of the running loop for ``request_id``; :meth:`discard` it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            self._waiters[request_id].append((loop, future))
        return future

    def notify(self, request_id: str, value: Any = None) -> None:
        """Wake every waiter of ``request_id`` with ``value`` (thread-safe)."""
        with self._lock:
            waiters = self._waiters.pop(request_id, [])
        for loop, future in waiters:
            resolve_soon(loop, future, value)

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._waiters)

    def discard(self, request_id: str, future: asyncio.Future[Any]) -> None:
        """Forget ``future`` (woken or not)."""
        with self._lock:
            waiters = self._waiters.get(request_id)
            if waiters is None:
                return
            waiters[:] = [w for w in waiters if w[1] is not future]
            if not waiters:
                del self._waiters[request_id]


async def wait_for_record(
    registry: WaiterRegistry,
    request_id: str,
    timeout: float,
    check: Callable[[], object],
    inline: bool = False,
) -> bool:
    """Wait until ``registry`` is notified for ``request_id`` or ``check()`` is truthy.

    ``inline`` calls ``check`` on the event loop (for checks that never block).

    Returns:
        ``True`` when ``check()`` was truthy or a notification came, ``False`` after
        ``timeout`` seconds without either.
    """
    with registry.waiting(request_id) as future:
        if check() if inline else await asyncio.to_thread(check):
            return True
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return False
        return True
