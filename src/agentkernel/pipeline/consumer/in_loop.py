"""Consume an in-memory queue on the event loop of the process's HTTP server (embedded topology).

With consumer threads, a no-op turn of the embedded topology crosses four threads (HTTP loop ->
INPUT consumer -> runner loop -> OUTPUT consumer -> HTTP loop), and each crossing costs a wake-up
and a hand-over of the GIL, more than the turn itself. An :class:`InLoopConsumer` fetches on the
event loop instead, woken by the broker the moment a message is ready, and runs each message as a
task there, through the same :class:`~agentkernel.pipeline.consumer.handling.MessageHandling` the
consumer threads use (permanent failure, ack after the handler, redelivery with back-off,
last-attempt isolation). The broker is unchanged: it still
leases, dedups and keeps one message per group in flight, so every transport guarantee holds;
only the threads are gone.

The price is that the turns share the HTTP server's loop: an ``async`` agent that blocks stalls
the API too (the stall watchdog names it), as it would stall the other turns on a runner's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.consumer.handling import MessageHandling
from agentkernel.pipeline.consumer.settings import DRAIN_TIMEOUT_SECONDS
from agentkernel.pipeline.runtime.thread_runner import ThreadRunner
from agentkernel.pipeline.transport.base import TransportConsumer
from agentkernel.pipeline.transport.blocking import adapt_consumer
from agentkernel.pipeline.transport.in_memory import InMemoryConsumer
from agentkernel.pipeline.wire.envelope import ATTR_REQUEST_ID, QueueMessage

logger = logging.getLogger(__name__)

#: Longest wait for a message before the stop flag is looked at again, in seconds.
WAIT_SLICE_SECONDS = 0.25


class InLoopConsumer:
    """Drives a :class:`MessageHandling` from a task on the running event loop.

    Args:
        handling: what each message goes through; a sync ``process`` runs on a worker thread.
        consumer_factory: creates the in-memory consumer to fetch from (when started); it is
            closed when this stops.
        max_in_flight: messages handled at once.
        drain_timeout: seconds a stopping consumer waits for the messages in flight; what is
            still unfinished then is logged and handed back.
        name: the queue's name, for logs.
    """

    def __init__(
        self,
        handling: MessageHandling,
        consumer_factory: Callable[[], InMemoryConsumer],
        *,
        max_in_flight: int,
        drain_timeout: float = DRAIN_TIMEOUT_SECONDS,
        name: str = "queue",
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self._handling, self._consumer_factory = handling, consumer_factory
        self._max_in_flight, self._drain_timeout, self._name = max_in_flight, drain_timeout, name
        self._tasks: dict[asyncio.Future[None], QueueMessage] = {}  # handling in progress
        self._consumer: InMemoryConsumer | None = None  # while fetching
        self._room: asyncio.Event | None = None
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._drain_since: float | None = None
        self._log = RateLimitedLog(logger)

    def start(self) -> asyncio.Task[None]:
        """Start consuming on the running event loop; returns the fetching task."""
        return asyncio.get_running_loop().create_task(self._run(), name=f"{self._name}-in-loop")

    @property
    def handling(self) -> MessageHandling:
        """What each message goes through."""
        return self._handling

    def stop(self, drain_timeout: float | None = None, since: float | None = None) -> None:
        """Stop fetching (from any thread); the messages in flight get ``drain_timeout`` seconds.

        Args:
            since: ``time.monotonic()`` when the drain began, if before this call (for the
                log line of a message handed back); default now.
        """
        if drain_timeout is not None:
            self._drain_timeout = max(drain_timeout, 0.0)
        self._drain_since = since if since is not None else time.monotonic()
        self._handling.stop()  # ends redelivery holds and outage waits at once
        self._stop.set()

    @property
    def stop_seconds(self) -> float:
        """Longest time from :meth:`stop` until it has drained and closed."""
        return WAIT_SLICE_SECONDS + self._drain_timeout

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds until the consumer has drained and closed."""
        return self._stopped.wait(timeout)

    async def _run(self) -> None:
        consumer = None
        try:
            consumer = self._consumer = self._consumer_factory()
            settling = adapt_consumer(consumer)  # what the handling awaits: inline calls
            await self._fetch_until_stopped(consumer, settling)
            self._consumer = None  # nothing handed over from now on: the drain sees it all
            await self._drain(settling)
        except Exception:  # like a crashed consumer thread: drain the process and exit
            logger.exception("the in-loop consumer of %s crashed", self._name)
            ThreadRunner.request_shutdown(1)
        finally:
            self._consumer = None
            if consumer is not None:
                consumer.close()
            self._handling.close()
            self._stopped.set()

    def hand_over(self, message: QueueMessage) -> bool:
        """Handle ``message``, not yet sent, right here in the caller's task, as if it had been
        sent and fetched at once; ``False``: it was not taken, and the caller sends it.

        Taken only when the queue would have handed it out at once (its group has nothing
        queued or in flight, and no message runs alone) and when the handling processes it in
        one call that never yields (:meth:`MessageHandling.process_unqueued`): so no message of
        its group is sent or fetched, no drain starts and no cancellation lands while it is
        handled. Its dedup id counts as sent, so a duplicate is dropped here as the send would
        drop it. If the handling raises, the message is given back and not taken: the send
        that follows gets the queue's retries. A reply handed over in the runner's task saves
        the queue's copy, lease, ack and the task that would handle it: about a tenth of an
        embedded no-op turn.
        """
        consumer = self._consumer
        if consumer is None or self._stop.is_set() or not self._handling.processes_unqueued:
            return False
        if not self._handling.fetch_open():
            return False
        taken = consumer.claim(message)
        if taken is None:
            logger.debug("dropping duplicate message %s handed over", message.dedup_id)
            return True
        if not taken:
            return False
        try:
            self._handling.process_unqueued(message)
        except Exception as exc:  # the queue's retries take it from here
            consumer.unclaim(message)
            self._log.log(
                logging.WARNING,
                f"{self._name}:hand_over:{type(exc).__name__}",
                "handling message %s (request %s) in its sender's task failed: %r; it is sent "
                "on %s instead",
                message.dedup_id,
                message.attributes.get(ATTR_REQUEST_ID, "-"),
                exc,
                self._name,
            )
            return False
        return True

    async def _fetch_until_stopped(
        self, consumer: InMemoryConsumer, settling: TransportConsumer
    ) -> None:
        self._room = asyncio.Event()
        while not self._stop.is_set():
            room = self._max_in_flight - len(self._tasks)
            if room <= 0 or not self._handling.fetch_open():
                self._room.clear()
                await _wait(self._room, WAIT_SLICE_SECONDS)
                continue
            messages = consumer.fetch(room, 0.0)
            if not messages:
                await consumer.wait_ready(WAIT_SLICE_SECONDS)
            for message in messages:
                self._start(settling, message)

    def _start(self, consumer: TransportConsumer, message: QueueMessage) -> None:
        task = asyncio.ensure_future(self._handling.begin(consumer, message))
        self._tasks[task] = message
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Future[None]) -> None:
        self._tasks.pop(task, None)
        if self._room is not None:
            self._room.set()
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._log.log(
                logging.ERROR,
                f"{self._name}:settle:{type(exc).__name__}",
                "settling a message of %s failed: %r",
                self._name,
                exc,
            )

    async def _drain(self, consumer: TransportConsumer) -> None:
        """Wait (bounded) for the messages in flight; hand back what is still unfinished."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self._drain_timeout)
        waited = time.monotonic() - (self._drain_since or time.monotonic())
        for task, message in list(self._tasks.items()):
            await self._handling.hand_back(consumer, message, waited)
            task.cancel()  # its result would no longer count
        self._log.flush()


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
