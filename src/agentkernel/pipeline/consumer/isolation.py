"""Last-attempt isolation: a suspect message runs alone, so a crash it causes costs only it.

A suspect is a redelivered message on its last allowed delivery or past it
(``1 < receive_count >= max_receive_count``): its earlier deliveries ended without an answer,
possibly because the process died under it or under a neighbour. With isolation on, the message
handling (:mod:`.handling`) fetches nothing more once a suspect is fetched, lets the turns already
running finish, runs the suspect on its own (its permanent-failure hook too, as the hook may run
it one more time), and only then fetches again. If the suspect crashes the process, no innocent
turn is in flight to be charged a delivery for it.

The Agent Runner's side of the rule is :mod:`agentkernel.pipeline.runner.last_attempt`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

from agentkernel.pipeline.wire.envelope import QueueMessage


def is_suspect(message: QueueMessage, max_receive_count: int) -> bool:
    """Whether ``message`` is a redelivery on its last allowed delivery or past it."""
    return 1 < message.receive_count >= max_receive_count


class Isolation:
    """Runs suspect messages alone on one event loop; fetching pauses while one waits.

    ``admit`` is called where messages are fetched (any thread); ``run_alone``/``run_normal`` on
    the event loop that handles them.
    """

    def __init__(self) -> None:
        self.fetch_open = threading.Event()
        self.fetch_open.set()
        self._pending = 0
        self._lock = threading.Lock()
        self._active = 0  # normal messages being processed (event-loop thread only)
        self._alone_waiting = 0  # suspects waiting for the normal messages to finish
        self._changed: asyncio.Condition | None = None
        self._one_at_a_time: asyncio.Lock | None = None

    def admit(self) -> None:
        """A suspect was fetched: stop fetching until it has run."""
        with self._lock:
            self._pending += 1
            self.fetch_open.clear()

    def _release(self) -> None:
        with self._lock:
            self._pending -= 1
            if self._pending == 0:
                self.fetch_open.set()

    def _condition(self) -> tuple[asyncio.Condition, asyncio.Lock]:
        if self._changed is None or self._one_at_a_time is None:
            self._changed, self._one_at_a_time = asyncio.Condition(), asyncio.Lock()
        return self._changed, self._one_at_a_time

    async def run_alone(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run an admitted suspect once nothing else runs, one suspect at a time."""
        changed, one_at_a_time = self._condition()
        try:
            async with one_at_a_time:
                self._alone_waiting += 1
                try:
                    async with changed:
                        await changed.wait_for(lambda: self._active == 0)
                finally:
                    self._alone_waiting -= 1
                await work()
        finally:
            self._release()

    async def run_normal(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run a normal message at once, counted so a waiting suspect knows when it is alone."""
        # Never held back: a message fetched before the suspect should finish before it runs
        # (and so be out of the way if the suspect crashes the process).
        self._active += 1
        try:
            await work()
        finally:
            self._active -= 1
            if self._alone_waiting:  # only a waiting suspect cares; skip the lock otherwise
                changed, _ = self._condition()
                async with changed:
                    changed.notify_all()
