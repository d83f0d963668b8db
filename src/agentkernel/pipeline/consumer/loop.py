"""Consuming a queue: the :class:`ConsumerLoop`.

``num_consumers`` threads each own a transport consumer. A thread fetches from it on an event
loop, the consumer's own (its ``home_loop``: NATS) or the loop's private one, and hands every
message to the queue's :class:`~agentkernel.pipeline.consumer.handling.MessageHandling` as a
task on that loop, so a message crosses no thread between its fetch, its handling and its ack
(each crossing costs a wake-up and a hand-over of the GIL, about as much CPU as the handling
itself). A blocking consumer was adapted on its way in: its fetches run on a thread of its own,
one hop per batch. Up to ``max_in_flight`` messages are handled at once when ``process`` is
async (a sync one is bounded to ``num_consumers * batch_size``). Per-session order holds
because the transport releases a group only when its message is acknowledged, and the handling
orders the messages of one group within a fetch. The thread itself only waits, and drains.

A consumer that cannot be created is created again with back-off, and a failing fetch is retried
after a pause. Every shutdown wait is bounded by ``drain_timeout``; what is still unfinished then
is logged by request id and handed back to the broker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

from agentkernel.core.errors import AKConfigError
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.consumer.handler import Handler
from agentkernel.pipeline.consumer.handling import HandlingPolicy, MessageHandling
from agentkernel.pipeline.consumer.in_flight import Slots, Tracker
from agentkernel.pipeline.consumer.settings import (
    CONSUMER_RETRY_SECONDS,
    FETCH_CLOSED_POLL_SECONDS,
    LATE_POLL_SECONDS,
    MAX_CONSUMER_RETRY_SECONDS,
    POLL_ERROR_BACKOFF_SECONDS,
    LoopSettings,
)
from agentkernel.pipeline.runtime.event_loop import LoopThread
from agentkernel.pipeline.runtime.thread_runner import ThreadRunner, close_in_order
from agentkernel.pipeline.transport.base import TransportConsumer
from agentkernel.pipeline.transport.blocking import AnyConsumer, adapt_consumer
from agentkernel.pipeline.transport.redelivery import STOP_CHECK_SECONDS, pause
from agentkernel.pipeline.wire.envelope import QueueMessage

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ConsumerLoop:
    """Run consumer threads that fetch from one queue and hand each message to ``handling``.

    Args:
        handling: what each message goes through; it runs on this loop's private event loop.
        consumer_factory: creates one transport consumer per thread.
        settings: how to fetch.
        stop: the loop stops once this is set; default :attr:`ThreadRunner.shutdown_event`
            (stop on process shutdown). Pass a private event to leave stopping to :meth:`stop`
            (a loop that must drain after another one). :meth:`stop` never sets it.
    """

    def __init__(
        self,
        handling: MessageHandling,
        consumer_factory: Callable[[], AnyConsumer],
        settings: LoopSettings | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.handling = handling
        self.settings = settings if settings is not None else LoopSettings()
        self._consumer_factory = consumer_factory
        self._queue = handling.queue
        self._stop = stop if stop is not None else ThreadRunner.shutdown_event
        self._stopped = threading.Event()
        handling.stop_when(self._stop)
        handling.stop_when(self._stopped)
        self._drain_timeout = self.settings.drain_timeout
        self._drain_since: float | None = None  # set by stop(since=...)
        s = self.settings
        self._slots = Slots(
            s.max_in_flight if handling.is_async else s.num_consumers * s.batch_size
        )
        self._loop = LoopThread(f"{self._queue}-turns", stall_warning=s.stall_warning)
        self._idle = threading.Event()
        self._running = 0
        self._running_lock = threading.Lock()
        self._error_backoff = POLL_ERROR_BACKOFF_SECONDS
        self._consumer_retry = CONSUMER_RETRY_SECONDS
        self._fetching = 0  # threads still in their fetch loop
        self._fetching_done = threading.Condition()
        handling.fetches_running(lambda: self._fetching > 0)
        self._log = RateLimitedLog(logger)

    @classmethod
    def from_handlers(
        cls,
        *,
        process: Handler,
        on_permanent_failure: Handler,
        consumer_factory: Callable[[], AnyConsumer],
        queue: str = "queue",
        stop: threading.Event | None = None,
        **settings: Any,
    ) -> ConsumerLoop:
        """A loop over a :class:`MessageHandling` of two callables.

        Args:
            settings: fields of :class:`HandlingPolicy` and of :class:`LoopSettings`.
        """
        policy_fields = {f.name for f in dataclasses.fields(HandlingPolicy)}
        policy = {k: v for k, v in settings.items() if k in policy_fields}
        loop = {k: v for k, v in settings.items() if k not in policy_fields}
        handling = MessageHandling(
            process, on_permanent_failure, queue=queue, policy=HandlingPolicy(**policy)
        )
        return cls(handling, consumer_factory, LoopSettings(**loop), stop)

    # -- lifecycle -------------------------------------------------------------------------

    def tasks(self) -> list[ThreadRunner.Task]:
        """One graceful :class:`ThreadRunner.Task` per consumer thread."""
        return [
            ThreadRunner.Task(
                execution_function=self.consume,
                thread_name=f"{self._queue}-consumer-{i}",
                stop_all_on_failure=True,
                graceful=True,
            )
            for i in range(self.settings.num_consumers)
        ]

    def run(self, close: Iterable[Callable[[], None]] = (), exit_on_shutdown: bool = True) -> None:
        """Run the consumer threads until stopped, then release clients; blocks.

        Args:
            close: ``close`` callables of the clients this loop used (transport, stores),
                called in order once the threads have drained, before the process exits.
            exit_on_shutdown: exit the process afterwards if a shutdown was requested.
        """
        ThreadRunner.run(
            self.tasks(), exit_on_shutdown=False, shutdown_timeout=self.shutdown_timeout
        )
        close_in_order(close)
        if exit_on_shutdown:
            ThreadRunner.exit_if_shutting_down()

    @property
    def shutdown_timeout(self) -> float:
        """Seconds after which a stopping loop is given up on.

        The drain, plus one fetch wait (a thread in a long poll finishes it before it stops),
        plus a margin for closing consumers.
        """
        return self._drain_timeout + self.settings.wait_seconds + STOP_CHECK_SECONDS + 5.0

    def stop(self, drain_timeout: float | None = None, since: float | None = None) -> None:
        """Stop this loop only (finish in-flight work, then return from :meth:`run`).

        Args:
            drain_timeout: seconds to wait for the work in flight, instead of the loop's own
                ``drain_timeout`` (a caller whose shutdown budget is partly spent).
            since: ``time.monotonic()`` when the drain began, if before this call (for the
                log line of a message handed back); default when each thread starts draining.
        """
        if drain_timeout is not None:
            self._drain_timeout = max(drain_timeout, 0.0)
        self._drain_since = since
        self._stopped.set()

    @property
    def stop_seconds(self) -> float:
        """Longest time from :meth:`stop` until every thread has ended: a blocking consumer
        finishes the fetch slice it is in (an SQS long poll), then the thread drains."""
        return self.settings.wait_seconds + STOP_CHECK_SECONDS + self._drain_timeout

    def stopping(self) -> bool:
        """Whether the consumer threads should stop fetching."""
        return self._stopped.is_set() or self._stop.is_set()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds until every consumer thread of this loop has finished.

        Returns:
            ``False`` when threads were still running at the timeout.
        """
        return self._idle.wait(timeout)

    # -- one consumer thread ---------------------------------------------------------------

    def consume(self) -> None:
        """Body of one consumer thread: fetch and hand out on the consumer's loop, then drain."""
        with self._running_lock:
            self._running += 1
            self._idle.clear()
        consumer: TransportConsumer | None = None
        try:
            consumer = self._open_consumer()
            if consumer is not None:
                home = consumer.home_loop()
                if home is not None and self.settings.stall_warning is not None:
                    home.watch_stalls(self.settings.stall_warning)
                tracker = Tracker((home or self._loop).loop)
                self._fetch_until_stopped(consumer, tracker)
                self._drain(consumer, tracker)
        finally:
            if consumer is not None:
                self._close(consumer)
            self._thread_finished()

    def _fetch_until_stopped(self, consumer: TransportConsumer, tracker: Tracker) -> None:
        with self._fetching_done:
            self._fetching += 1
        try:
            self._fetch_on_loop(consumer, tracker)
        finally:
            try:
                self._run_late(consumer, tracker, self._await(tracker, consumer.stop_fetching()))
            except Exception:
                logger.warning("stopping the fetches of %s failed", self._queue, exc_info=True)
            with self._fetching_done:
                self._fetching -= 1
                self._fetching_done.notify_all()

    def _await(self, tracker: Tracker, coro: Coroutine[Any, Any, T]) -> T:
        """From this thread: run ``coro`` on the tracker's loop and wait for it."""
        try:
            future = asyncio.run_coroutine_threadsafe(coro, tracker.loop)
        except RuntimeError:  # the loop ended under us (its transport was closed)
            coro.close()
            raise
        return future.result()

    def _run_late(
        self, consumer: TransportConsumer, tracker: Tracker, late: list[QueueMessage]
    ) -> None:
        """Run, as part of the drain, what arrived here after the last fetch; a message that
        finds no free place within the drain is handed back."""
        began = self._drain_since or time.monotonic()
        deadline = began + self._drain_timeout  # one bound for them all, not one each
        for message in late:
            if self._slots.take(1, max(deadline - time.monotonic(), 0.0)):
                self._submit(consumer, message, tracker)
            else:
                self._hand_back(consumer, tracker, message, began)

    def _hand_back(
        self, consumer: TransportConsumer, tracker: Tracker, message: QueueMessage, began: float
    ) -> None:
        waited = time.monotonic() - began
        try:
            self._await(tracker, self.handling.hand_back(consumer, message, waited))
        except RuntimeError:
            logger.warning("cannot hand %s back: its consumer's loop ended", message.message_id)

    def _open_consumer(self) -> TransportConsumer | None:
        """This thread's consumer, created again with back-off until it works or we stop.

        A configuration error (a missing stream, a bad setting) does not heal by waiting, so
        it is raised; ``None`` means the loop was stopped before a consumer could be made.
        """
        delay = self._consumer_retry
        while not self.stopping():
            try:
                return adapt_consumer(self._consumer_factory())
            except AKConfigError:
                raise
            except Exception as exc:
                self._log.log(
                    logging.WARNING,
                    f"{self._queue}:consumer:{type(exc).__name__}",
                    "creating a consumer of %s failed (%r); retrying in %.1fs",
                    self._queue,
                    exc,
                    delay,
                )
                self._sleep(delay)
                delay = min(delay * 2, MAX_CONSUMER_RETRY_SECONDS)
        return None

    def _drain(self, consumer: TransportConsumer, tracker: Tracker) -> None:
        """Wait (bounded) for the messages in hand; hand back what is still unfinished.

        Nothing is handed back before every thread of the loop has stopped fetching: a sibling
        still fetching would take the message again, and each bounce costs a delivery.
        """
        began = self._drain_since or time.monotonic()
        if not self._drains_late(consumer, tracker, began + self._drain_timeout):
            return
        with self._fetching_done:
            self._fetching_done.wait_for(
                lambda: self._fetching == 0, self.settings.wait_seconds + STOP_CHECK_SECONDS
            )
        for message in tracker.pending():
            self._hand_back(consumer, tracker, message, began)
            tracker.cancel(message)  # its result would no longer count

    def _drains_late(self, consumer: TransportConsumer, tracker: Tracker, deadline: float) -> bool:
        """Wait until nothing is in hand; returns ``False`` when that happened by ``deadline``.

        A consumer that hands the drain messages (``stop_fetching``) may have more once the
        ones in hand settle: a session's next turn, delivered here before the drain, can run
        once the one before it is acked (NATS). Those run here too, in the same bound.
        """
        while True:
            left = deadline - time.monotonic()
            idle = tracker.wait_idle(max(min(LATE_POLL_SECONDS, left), 0.0))
            try:
                late = self._await(tracker, consumer.stop_fetching())
            except Exception:
                logger.warning("stopping the fetches of %s failed", self._queue, exc_info=True)
                late = []
            if late:
                self._run_late(consumer, tracker, late)
            elif idle:
                return False
            elif left <= 0:
                return True

    def _close(self, consumer: TransportConsumer) -> None:
        try:
            (consumer.home_loop() or self._loop).run(consumer.close())
        except Exception:
            logger.warning("closing a consumer of %s failed", self._queue, exc_info=True)

    def _sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, waking early when the loop stops."""
        deadline = time.monotonic() + seconds
        while not self.stopping() and (left := deadline - time.monotonic()) > 0:
            self._stopped.wait(min(left, STOP_CHECK_SECONDS))

    def _fetch_failed(self) -> None:
        exc = sys.exc_info()[1]
        self._log.log(
            logging.ERROR,
            f"{self._queue}:fetch:{type(exc).__name__}",
            "fetch from %s failed; retrying in %ss",
            self._queue,
            self._error_backoff,
            exc_info=True,
        )

    def _submit(self, consumer: TransportConsumer, message: QueueMessage, tracker: Tracker) -> None:
        """From this thread: start handling ``message`` on the tracker's loop."""
        release = self._slots.place()  # freed when done, or when it only waits out a delay
        tracker.add(message)
        coro = self.handling.begin(consumer, message, release)
        future = asyncio.run_coroutine_threadsafe(coro, tracker.loop)
        tracker.attach(message, future)

        def finished(_: concurrent.futures.Future[None]) -> None:
            release()
            tracker.done(message)

        future.add_done_callback(finished)

    # -- fetching on the consumer's loop ---------------------------------------------------

    def _fetch_on_loop(self, consumer: TransportConsumer, tracker: Tracker) -> None:
        """Fetch and handle on the tracker's loop until stopped; this thread waits.

        Returns early when that loop ends under us (the transport was closed): the drain then
        finds the handlings cancelled with it.
        """
        loop = tracker.loop
        future = asyncio.run_coroutine_threadsafe(self._fetch_loop(consumer, tracker), loop)
        while not loop.is_closed() and loop.is_running():
            try:
                future.result(STOP_CHECK_SECONDS)
                return
            except concurrent.futures.TimeoutError:
                if self.stopping():
                    future.cancel()  # ends the fetch it waits in; stop_fetching has the rest
                continue
            except concurrent.futures.CancelledError:
                return
        future.cancel()

    async def _fetch_loop(self, consumer: TransportConsumer, tracker: Tracker) -> None:
        wait = self.settings.wait_seconds
        while not self.stopping():
            if not self.handling.fetch_open():  # a suspect runs alone
                await asyncio.sleep(FETCH_CLOSED_POLL_SECONDS)
                continue
            room = self._slots.take(self.settings.batch_size, 0.0)
            if not room:
                await self._slots.wait_async(min(wait, STOP_CHECK_SECONDS * 4))
                continue
            try:
                messages = list(await consumer.fetch(room, wait) or ())
            except asyncio.CancelledError:
                self._slots.give(room)
                raise
            except Exception:
                self._slots.give(room)
                self._fetch_failed()
                await pause(self._error_backoff, self.stopping)
                continue
            self._slots.give(room - len(messages))
            for message in messages:
                self._begin(consumer, message, tracker)

    def _begin(self, consumer: TransportConsumer, message: QueueMessage, tracker: Tracker) -> None:
        """On the tracker's loop: start handling ``message`` as a task there."""
        release = self._slots.place()
        tracker.add(message)
        task = asyncio.ensure_future(self.handling.begin(consumer, message, release))
        tracker.attach(message, task)

        def finished(task: asyncio.Future[None]) -> None:
            release()
            tracker.done(message)
            if not task.cancelled() and (exc := task.exception()) is not None:
                self._log.log(
                    logging.ERROR,
                    f"{self._queue}:settle:{type(exc).__name__}",
                    "settling a message of %s failed: %r",
                    self._queue,
                    exc,
                )

        task.add_done_callback(finished)

    def _thread_finished(self) -> None:
        with self._running_lock:
            self._running -= 1
            last = self._running == 0
        if last:
            self.handling.close()
            self._loop.stop()
            self._log.flush()
            self._idle.set()
