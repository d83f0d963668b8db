"""Run a set of callables as peer threads with one failure and shutdown policy.

A task that opts into ``graceful=True`` and crashes sets the process-wide
:attr:`ThreadRunner.shutdown_event`; its sibling tasks finish the message in hand and return, and
then the process exits with status 1 so the orchestrator (ECS, Kubernetes) starts a fresh one. A
crash of a non-graceful ``stop_all_on_failure`` task exits at once. SIGTERM and SIGINT drain the
same way and exit with status 0. A drain is bounded: with ``shutdown_timeout`` set, :meth:`run`
stops waiting that many seconds after the shutdown began and names the tasks still running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import FrameType
from typing import Any, ClassVar

from agentkernel.pipeline.runtime import tracing

logger = logging.getLogger(__name__)


def hard_exit(code: int) -> None:
    """Flush spans, logs and standard streams, then end the process without running cleanups."""
    tracing.flush()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken stream
            stream.flush()
    os._exit(code)


class ThreadRunner:
    """Runs :class:`Task` callables as threads; see the module docstring for the policy."""

    #: Set when the process is shutting down (signal or a graceful task's crash).
    shutdown_event: ClassVar[threading.Event] = threading.Event()
    #: Status the process exits with once the drain is over: 1 after a crash, 0 after a signal.
    shutdown_exit_code: ClassVar[int] = 1

    @dataclass(frozen=True)
    class Task:
        """One callable to run on its own thread.

        Attributes:
            execution_function: the callable; called with ``item`` when it is not ``None``.
            thread_name: the thread's name.
            item: the single argument, if any.
            stop_task_on_failure: a raised exception ends this task (otherwise it is ignored).
            stop_all_on_failure: a raised exception ends the process (requires the previous).
            graceful: drain the sibling tasks before exiting (requires ``stop_all_on_failure``).
            awaited_on_shutdown: ``run`` waits for this task before it returns or exits.
        """

        execution_function: Callable[..., Any]
        thread_name: str
        item: Any = None
        stop_task_on_failure: bool = True
        stop_all_on_failure: bool = False
        graceful: bool = False
        awaited_on_shutdown: bool = True

        def __post_init__(self) -> None:
            if self.stop_all_on_failure and not self.stop_task_on_failure:
                raise ValueError("stop_all_on_failure requires stop_task_on_failure")
            if self.graceful and not self.stop_all_on_failure:
                raise ValueError("graceful requires stop_all_on_failure")

    @classmethod
    def run(
        cls,
        tasks: list[Task],
        max_workers: int | None = None,
        exit_on_shutdown: bool = True,
        shutdown_timeout: float | None = None,
    ) -> dict[str, Any]:
        """Start every task and wait for the awaited ones.

        Args:
            tasks: the tasks; thread names should be unique (results are keyed by them).
            max_workers: at most this many tasks run at once, the others start as running ones
                end (upstream's parameter, in its position); ``None`` runs them all at once.
            exit_on_shutdown: once the awaited tasks are done, exit the process if a shutdown
                was requested; ``False`` returns instead (for nested runs).
            shutdown_timeout: seconds to keep waiting for the awaited tasks once a shutdown
                was requested; ``None`` waits as long as they take.

        Returns:
            each finished task's return value, by thread name.

        Raises:
            ValueError: ``max_workers`` is below 1.
        """
        if max_workers is not None and (
            not isinstance(max_workers, int) or isinstance(max_workers, bool) or max_workers < 1
        ):
            raise ValueError(f"max_workers must be a positive int or None, not {max_workers!r}")
        slots = threading.BoundedSemaphore(max_workers or max(len(tasks), 1))
        reports: queue.Queue[tuple[ThreadRunner.Task, Any]] = queue.Queue()
        for task in tasks:
            threading.Thread(
                target=cls._guard, args=(task, reports, slots), name=task.thread_name, daemon=True
            ).start()
        results: dict[str, Any] = {}
        awaited = {task.thread_name for task in tasks if task.awaited_on_shutdown}
        shutdown_seen: float | None = None
        while awaited:
            if shutdown_timeout is not None and cls.shutdown_event.is_set():
                shutdown_seen = shutdown_seen or time.monotonic()
                if time.monotonic() - shutdown_seen > shutdown_timeout:
                    logger.error(
                        "shutdown timed out after %.1fs; still running: %s",
                        shutdown_timeout,
                        ", ".join(sorted(awaited)),
                    )
                    break
            try:
                task, result = reports.get(timeout=0.5)
            except queue.Empty:
                continue
            results[task.thread_name] = result
            awaited.discard(task.thread_name)
        if exit_on_shutdown:
            cls.exit_if_shutting_down()
        return results

    @classmethod
    def exit_if_shutting_down(cls) -> None:
        """End the process with :attr:`shutdown_exit_code` if a shutdown was requested."""
        if cls.shutdown_event.is_set():
            logger.info("drain finished; exiting with status %s", cls.shutdown_exit_code)
            hard_exit(cls.shutdown_exit_code)

    @classmethod
    def _guard(
        cls, task: Task, reports: queue.Queue[tuple[Task, Any]], slots: threading.BoundedSemaphore
    ) -> None:
        result: Any = None
        try:
            with slots:
                fn = task.execution_function
                result = fn() if task.item is None else fn(task.item)
        except BaseException as exc:
            cls._on_failure(task, exc)
        finally:
            reports.put((task, result))

    @classmethod
    def _on_failure(cls, task: Task, exc: BaseException) -> None:
        if not task.stop_task_on_failure:
            logger.debug("task %s failed and is ignored: %r", task.thread_name, exc)
            return
        logger.error("task %s crashed", task.thread_name, exc_info=exc)
        if not task.stop_all_on_failure:
            return
        if not task.graceful:
            hard_exit(1)
        cls.shutdown_exit_code = 1
        cls.shutdown_event.set()

    @classmethod
    def request_shutdown(cls, exit_code: int = 0) -> None:
        """Ask every task to finish its current work; the process exits with ``exit_code``."""
        if not cls.shutdown_event.is_set():
            cls.shutdown_exit_code = exit_code
        cls.shutdown_event.set()

    @classmethod
    def install_signal_handlers(cls, on_signal: Callable[[], None] | None = None) -> bool:
        """Make SIGTERM/SIGINT drain and exit 0; a second signal exits at once (status 130).

        Must be called on the main thread; elsewhere it logs a warning and returns ``False``.
        """
        if threading.current_thread() is not threading.main_thread():
            logger.warning("signal handlers can only be installed on the main thread")
            return False

        seen = 0

        def handle(signum: int, frame: FrameType | None) -> None:
            nonlocal seen
            seen += 1
            if seen > 1:
                hard_exit(130)
            logger.info("received %s; draining in-flight work", signal.Signals(signum).name)
            cls.request_shutdown(0)
            if on_signal is not None:
                on_signal()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
        return True

    @classmethod
    def reset(cls) -> None:
        """Clear the shutdown state (tests)."""
        cls.shutdown_event.clear()
        cls.shutdown_exit_code = 1


def close_in_order(closers: Iterable[Callable[[], None]]) -> None:
    """Call each ``close`` in turn; a failing one is logged and the rest still run."""
    for close in closers:
        try:
            close()
        except Exception:
            logger.warning("closing %r failed", close, exc_info=True)
