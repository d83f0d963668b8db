"""One private asyncio event loop running on its own thread, for callers that are threads."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)


def resolve_soon(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], value: Any = None
) -> None:
    """Resolve ``future`` (of ``loop``) with ``value`` from any thread.

    On the loop's own thread the future is resolved directly: ``call_soon_threadsafe`` would
    also write to the loop's self-pipe, a system call and an extra loop wake-up per reply.
    """
    if asyncio._get_running_loop() is loop:
        _resolve(future, value)
    else:
        loop.call_soon_threadsafe(_resolve, future, value)


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


class LoopThread:
    """Owns an event loop on a daemon thread; coroutines are submitted from any thread.

    Args:
        name: thread name, for logs and stack dumps.
        max_workers: threads of the loop's default executor (``asyncio.to_thread``), which is
            where blocking calls such as a broker ack run without stalling the loop.
    """

    def __init__(
        self, name: str, max_workers: int = 32, stall_warning: float | None = None
    ) -> None:
        self._name = name
        self._max_workers = max_workers
        self._stall_warning = stall_warning
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
        if self._stall_warning is not None:
            StallWatchdog(loop, self._thread, self._stall_warning).start()

    def watch_stalls(self, threshold: float) -> None:
        """Warn when the running loop is blocked over ``threshold`` seconds (once per loop: a
        later call changes nothing)."""
        loop = self.loop
        with self._lock:
            if self._stall_warning is not None or self._thread is None:
                return
            self._stall_warning = threshold
            StallWatchdog(loop, self._thread, threshold).start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the loop; returns a thread-safe future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (cancelling it on timeout).

        Raises:
            RuntimeError: called on the loop's own thread, where waiting would never end.
        """
        if self._thread is threading.current_thread():
            coro.close()
            raise RuntimeError(f"{self._name}: run() called on its own loop; await it there")
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
        thread.join(timeout)  # the watchdog notices the loop stopped and ends by itself
        if not thread.is_alive():
            loop.close()


class StallWatchdog:
    """Warns when the loop does not run a callback for ``threshold`` seconds.

    Something running on the loop is blocking it (a ``time.sleep``, a blocking HTTP call in an
    ``async def`` agent), which stalls every other turn of the process. The warning names the
    agent and request found on the loop thread's stack, and is given once per stall.
    """

    PROBE_INTERVAL = 0.25

    def __init__(
        self, loop: asyncio.AbstractEventLoop, thread: threading.Thread, threshold: float
    ) -> None:
        self._loop, self._loop_thread, self._threshold = loop, thread, threshold

    def start(self) -> None:
        threading.Thread(
            target=self._run, name=f"{self._loop_thread.name}-watchdog", daemon=True
        ).start()

    def _run(self) -> None:
        while self._loop_thread.is_alive() and not self._loop.is_closed():
            answered = threading.Event()
            started = time.monotonic()
            try:
                self._loop.call_soon_threadsafe(answered.set)
            except RuntimeError:  # the loop was closed meanwhile
                return
            if not answered.wait(self._threshold):
                if self._idle():  # waiting for I/O: the process was not scheduled, not blocked
                    answered.wait()
                    time.sleep(self.PROBE_INTERVAL)
                    continue
                self._warn(self._culprit())
                answered.wait()
                logger.warning(
                    "event loop %s was blocked for %.3fs",
                    self._loop_thread.name,
                    time.monotonic() - started,
                )
            time.sleep(self.PROBE_INTERVAL)

    def _idle(self) -> bool:
        """Whether the loop thread sits in the selector's wait for I/O (nothing runs on it)."""
        frame = sys._current_frames().get(self._loop_thread.ident or -1)
        return frame is not None and frame.f_code.co_filename.endswith("selectors.py")

    def _culprit(self) -> tuple[str, str, str]:
        """(agent, request id, code location) of what is running on the loop thread."""
        frame = sys._current_frames().get(self._loop_thread.ident or -1)
        where, agent, request = "unknown", "unknown", "unknown"
        while frame is not None:
            if where == "unknown" and "asyncio" not in frame.f_code.co_filename:
                where = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
            turn: Any = frame.f_locals.get("turn")
            if turn is not None and hasattr(turn, "request_id") and hasattr(turn, "agent"):
                agent, request = str(turn.agent), str(turn.request_id)
                break
            frame = frame.f_back
        return agent, request, where

    def _warn(self, culprit: tuple[str, str, str]) -> None:
        agent, request, where = culprit
        logger.warning(
            "event loop %s blocked for over %ss by agent %s (request %s) at %s; "
            "async agents must not block: use 'def' agents or asyncio.to_thread for blocking work",
            self._loop_thread.name,
            self._threshold,
            agent,
            request,
            where,
        )
