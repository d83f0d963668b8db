"""Keep the leases of messages in progress alive, so a long turn is not delivered twice.

A transport consumer that reports ``lease_seconds`` gets ``extend_lease`` called for each
message being handled, a third of the lease after the previous extension; a lease is extended two
more times before it could run out even if one call fails. Handling that ends (ack, nack, or the
process draining) stops the extensions.

Leases are short by default (30 s on NATS and SQS) so that a crashed runner costs seconds, which
makes the extensions time-critical: they run on a small pool of threads, so one slow or hanging
broker call cannot hold up the extensions of every other message.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from agentkernel.pipeline.transport.base import TransportConsumer
from agentkernel.pipeline.transport.sync_face import run_for
from agentkernel.pipeline.wire.envelope import QueueMessage

logger = logging.getLogger(__name__)

EXTENSION_THREADS = 8


class LeaseKeeper:
    """One thread that extends the leases of every tracked message when they come due."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._due: dict[int, tuple[float, float, TransportConsumer, QueueMessage]] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._wake_at = float("inf")
        self._pool: ThreadPoolExecutor | None = None
        self._extending: set[int] = set()  # messages whose extension call has not returned

    def track(self, consumer: TransportConsumer, message: QueueMessage) -> None:
        """Start extending ``message``'s lease (no-op for transports without leases)."""
        lease = consumer.lease_seconds
        if lease is None:
            return
        interval = lease / 3
        due = time.monotonic() + interval
        with self._cond:
            self._due[id(message)] = (due, interval, consumer, message)
            self._stopped = False
            if self._thread is None:
                self._pool = ThreadPoolExecutor(EXTENSION_THREADS, f"{self._name}-extend")
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            if due < self._wake_at:  # only when the keeper would otherwise sleep past it
                self._cond.notify()

    def untrack(self, message: QueueMessage) -> None:
        """Stop extending ``message``'s lease."""
        with self._cond:
            self._due.pop(id(message), None)

    def stop(self) -> None:
        """End the keeper thread; tracked messages are forgotten."""
        with self._cond:
            self._stopped = True
            self._due.clear()
            thread, self._thread = self._thread, None
            pool, self._pool = self._pool, None
            self._cond.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopped or self._pool is None:
                    return
                now = time.monotonic()
                due = [(key, entry) for key, entry in self._due.items() if entry[0] <= now]
                for key, (_, interval, consumer, message) in due:
                    self._due[key] = (now + interval, interval, consumer, message)
                if not due:
                    soonest = min((entry[0] for entry in self._due.values()), default=now + 60)
                    self._wake_at = soonest
                    self._cond.wait(max(soonest - now, 0.01))
                    self._wake_at = float("inf")
                    continue
                for key, (_, _, consumer, message) in due:
                    if key not in self._extending:  # the previous call still runs: skip this one
                        self._extending.add(key)
                        self._pool.submit(self._extend, key, consumer, message)

    def _extend(self, key: int, consumer: TransportConsumer, message: QueueMessage) -> None:
        try:
            run_for(consumer, consumer.extend_lease(message))
        except Exception:
            logger.warning("lease extension of %s failed", message.message_id, exc_info=True)
        finally:
            with self._cond:
                self._extending.discard(key)
