"""Consumers kept waiting in ``fetch`` on threads, for the contract's group-lock case."""

from __future__ import annotations

import threading
import time

from agentkernel.pipeline.transport.sync_face import SyncConsumer

#: Longest single fetch of a waiting consumer, in seconds.
FETCH_SLICE_SECONDS = 2.0


class GroupLockWatch:
    """Each consumer fetches on its own thread until :meth:`stop_at`'s time, one message at a
    time and never acking; every message is noted with when it was received (monotonic)."""

    def __init__(self, consumers: list[SyncConsumer]) -> None:
        self._consumers = consumers
        self._received: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        self._until = float("inf")
        self._threads = [
            threading.Thread(target=self._wait_in_fetch, args=(c,), daemon=True) for c in consumers
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def wait_for(self, body: str, timeout: float) -> None:
        """Block until a message with ``body`` was received, at most ``timeout`` seconds."""
        with self._changed:
            self._changed.wait_for(lambda: any(b == body for _, b in self._received), timeout)

    def stop_at(self, when: float) -> None:
        """Stop fetching at monotonic time ``when`` (a fetch under way finishes first)."""
        with self._changed:
            self._until = when

    def join(self, timeout: float) -> list[tuple[float, str]]:
        """Wait for the threads (each at most ``timeout`` plus a fetch slice); what they got."""
        for thread in self._threads:
            thread.join(timeout + FETCH_SLICE_SECONDS)
        with self._changed:
            return list(self._received)

    def _wait_in_fetch(self, consumer: SyncConsumer) -> None:
        holding = False  # one in flight per consumer, like a thread running a turn
        while not holding and (left := self._left()) > 0:
            for message in consumer.fetch(1, min(left, FETCH_SLICE_SECONDS)):
                holding = True
                with self._changed:
                    self._received.append((time.monotonic(), message.body))
                    self._changed.notify_all()

    def _left(self) -> float:
        with self._changed:
            return self._until - time.monotonic()
