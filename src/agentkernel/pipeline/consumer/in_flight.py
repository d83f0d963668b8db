"""What a consumer loop has in flight: free places shared by its threads, messages per thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from agentkernel.pipeline.envelope import QueueMessage


class Slots:
    """Counts free in-flight places shared by all consumer threads of a loop."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._cond = threading.Condition()

    def take(self, wanted: int, timeout: float) -> int:
        """Take up to ``wanted`` places, waiting at most ``timeout`` seconds for one."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._free > 0, timeout):
                return 0
            taken = min(wanted, self._free)
            self._free -= taken
            return taken

    def give(self, count: int = 1) -> None:
        if count:
            with self._cond:
                self._free += count
                self._cond.notify_all()

    def place(self) -> Callable[[], None]:
        """A release of one taken place that frees it once, however often it is called."""
        given = threading.Event()
        lock = threading.Lock()

        def release() -> None:
            with lock:
                if given.is_set():
                    return
                given.set()
            self.give()

        return release


class Tracker:
    """Messages a consumer thread has handed out and not yet settled."""

    def __init__(self) -> None:
        self._messages: dict[int, QueueMessage] = {}
        self._futures: dict[int, Future[None]] = {}  # the handling of a message
        self._cond = threading.Condition()

    def add(self, message: QueueMessage) -> None:
        with self._cond:
            self._messages[id(message)] = message

    def attach(self, message: QueueMessage, future: Future[None]) -> None:
        with self._cond:
            if id(message) in self._messages:
                self._futures[id(message)] = future

    def done(self, message: QueueMessage) -> None:
        with self._cond:
            self._messages.pop(id(message), None)
            self._futures.pop(id(message), None)
            self._cond.notify_all()

    def cancel(self, message: QueueMessage) -> None:
        """Cancel the handling of ``message``, if any."""
        with self._cond:
            future = self._futures.get(id(message))
        if future is not None:
            future.cancel()

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every message to be settled; ``False`` if not."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._messages, timeout)

    def pending(self) -> list[QueueMessage]:
        with self._cond:
            return list(self._messages.values())
