"""One private asyncio event loop running on its own thread, for callers that are threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """Owns an event loop on a daemon thread; coroutines are submitted from any thread.

    Args:
        name: thread name, for logs and stack dumps.
        max_workers: threads of the loop's default executor (``asyncio.to_thread``), which is
            where blocking calls such as a broker ack run without stalling the loop.
    """

    def __init__(self, name: str, max_workers: int = 32) -> None:
        self._name = name
        self._max_workers = max_workers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, started on first use."""
        with self._lock:
            if self._loop is None:
                self._start()
            assert self._loop is not None
            return self._loop

    def _start(self) -> None:
        loop = asyncio.new_event_loop()
        loop.set_default_executor(
            ThreadPoolExecutor(self._max_workers, thread_name_prefix=f"{self._name}-io")
        )
        ready = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._thread = threading.Thread(target=main, name=self._name, daemon=True)
        self._thread.start()
        ready.wait(5)
        self._loop = loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the loop; returns a thread-safe future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (cancelling it on timeout)."""
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop and join its thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if not thread.is_alive():
            loop.close()
