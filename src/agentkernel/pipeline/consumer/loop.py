"""Consuming a queue: the :class:`ConsumerLoop` and the :class:`QueueConsumer` base.

Per message the loop does what the SQS FIFO pipeline did: a message delivered more than
``max_receive_count`` times goes to the permanent-failure hook (which answers the caller) and is
dead-lettered; otherwise it is processed and acknowledged; a failure nacks it so the transport
redelivers it. An ``async`` process function lets one loop keep up to ``max_in_flight`` messages
running at once on a private event loop, whatever the number of consumer threads; per-session
order still holds because the transport releases a group only when its message is acknowledged.
A fetch may return several messages of one group (SQS FIFO batches do); the loop then handles
each only after the previous one of its group has been settled.

Failures cost little: a failed message is handed back after a delay that doubles with each
delivery (see :mod:`agentkernel.pipeline.consumer.redelivery`), one that failed because a store is
unreachable is tried again in place without spending a delivery (see
:mod:`agentkernel.pipeline.consumer.outage`), repeated failures are logged once per interval with a
count, and a consumer that cannot be created is created again with back-off.
Every shutdown wait is bounded by ``drain_timeout``; what is still unfinished then is logged by
request id and handed back to the broker.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Future
from typing import Any

from agentkernel.core.blocking import call
from agentkernel.core.errors import AKConfigError
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.consumer.base import Handler, is_async_callable
from agentkernel.pipeline.consumer.lease import LeaseKeeper
from agentkernel.pipeline.consumer.outage import OutageRetry
from agentkernel.pipeline.consumer.redelivery import (
    MAX_RETRY_BACKOFF_SECONDS,
    RETRY_BACKOFF_SECONDS,
    STOP_CHECK_SECONDS,
    Redelivery,
)
from agentkernel.pipeline.envelope import ATTR_REQUEST_ID, QueueMessage, QueueName
from agentkernel.pipeline.process.event_loop import LoopThread
from agentkernel.pipeline.process.metrics import METRICS
from agentkernel.pipeline.process.thread_runner import ThreadRunner, close_in_order
from agentkernel.pipeline.transport.base import TransportConsumer

logger = logging.getLogger(__name__)

POLL_ERROR_BACKOFF_SECONDS = 5.0
#: First wait before creating a consumer again after creating it failed; doubles, capped.
CONSUMER_RETRY_SECONDS = 1.0
MAX_CONSUMER_RETRY_SECONDS = 30.0
DRAIN_TIMEOUT_SECONDS = 20.0


class _Slots:
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


class _Tracker:
    """Messages a consumer thread has handed out and not yet settled."""

    def __init__(self) -> None:
        self._messages: dict[int, QueueMessage] = {}
        self._futures: dict[int, Future[None]] = {}  # async handling of a message
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
        """Cancel the async handling of ``message``, if any."""
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


class _Isolation:
    """Runs suspect messages alone in the process, so a crash they cause costs only them.

    A suspect is a redelivered message on its last allowed delivery or past it (then the
    permanent-failure hook runs alone, as it may decide to run the message one more time): its
    earlier deliveries ended without an answer, possibly because the process died under it or
    under a neighbour.
    Once one is fetched the loop fetches nothing more, lets the turns already running finish,
    runs the suspect on its own, and only then fetches again. If the suspect crashes the
    process, no innocent turn is in flight to be charged a delivery for it.
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
        """A suspect was fetched (consumer thread): stop fetching until it has run."""
        with self._lock:
            self._pending += 1
            self.fetch_open.clear()

    def _release(self) -> None:
        with self._lock:
            self._pending -= 1
            if self._pending == 0:
                self.fetch_open.set()

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
            self._one_at_a_time = asyncio.Lock()
        return self._changed

    async def run_alone(self, work: Callable[[], Awaitable[None]]) -> None:
        changed = self._condition()
        try:
            async with self._one_at_a_time:  # type: ignore[union-attr]
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
        # Never held back: a message fetched before the suspect should finish before it runs
        # (and so be out of the way if the suspect crashes the process).
        self._active += 1
        try:
            await work()
        finally:
            self._active -= 1
            if self._alone_waiting:  # only a waiting suspect cares; skip the lock otherwise
                changed = self._condition()
                async with changed:
                    changed.notify_all()


class ConsumerLoop:
    """Run ``num_consumers`` threads that fetch from one queue and handle each message.

    Args:
        process: handles one message; sync or ``async``. Raising nacks the message; raising
            ``StoreUnavailableError`` calls it again in place instead (the hook below too).
        on_permanent_failure: runs for a message delivered more than ``max_receive_count``
            times, before it is dead-lettered; sync or ``async``. Raising leaves it queued.
        consumer_factory: creates one transport consumer per thread.
        max_receive_count: deliveries allowed before the permanent-failure hook.
        num_consumers: consumer threads.
        batch_size: messages asked for per fetch.
        max_in_flight: messages handled at once across all threads when ``process`` is async
            (sync handlers run one at a time on their consumer thread).
        wait_seconds: longest wait per fetch; sliced to the consumer's
            ``fetch_wait_slice_seconds`` (about a second by default) so shutdown is noticed.
        lease_extension: extend a message's lease while it is being handled.
        queue: the queue's name, for logs and thread names.
        isolate_last_attempt: run a redelivered message on its last allowed delivery (and the
            permanent-failure hook of one past it) alone in this process (async ``process``
            only), so a message that crashes the process (a poison turn) cannot use up the
            deliveries of messages in flight beside it.
        stall_warning: warn when the event loop of an async ``process`` is blocked longer than
            this many seconds (``None``: off).
        exit_on_shutdown: passed to :meth:`ThreadRunner.run` by :meth:`run`.
        stop_on_shutdown: stop when :attr:`ThreadRunner.shutdown_event` is set; ``False`` leaves
            stopping to :meth:`stop` (a loop that must drain after another one).
        drain_timeout: seconds a stopping thread waits for its messages in flight; what is
            still unfinished then is logged and handed back (nacked).
        retry_backoff: seconds before a failed message's first redelivery; the delay doubles
            with each delivery up to ``max_retry_backoff`` seconds.
    """

    def __init__(
        self,
        *,
        process: Handler,
        on_permanent_failure: Handler,
        consumer_factory: Callable[[], TransportConsumer],
        max_receive_count: int = 3,
        num_consumers: int = 1,
        batch_size: int = 1,
        max_in_flight: int = 256,
        wait_seconds: float = 20.0,
        lease_extension: bool = True,
        queue: QueueName | str = "queue",
        isolate_last_attempt: bool = False,
        stall_warning: float | None = None,
        exit_on_shutdown: bool = True,
        stop_on_shutdown: bool = True,
        drain_timeout: float = DRAIN_TIMEOUT_SECONDS,
        retry_backoff: float = RETRY_BACKOFF_SECONDS,
        max_retry_backoff: float = MAX_RETRY_BACKOFF_SECONDS,
    ) -> None:
        if num_consumers < 1 or batch_size < 1 or max_in_flight < 1:
            raise ValueError("num_consumers, batch_size and max_in_flight must be at least 1")
        if drain_timeout < 0:
            raise ValueError("drain_timeout must not be negative")
        self._process = process
        self._on_permanent_failure = on_permanent_failure
        self._consumer_factory = consumer_factory
        self._max_receive_count = max_receive_count
        self._num_consumers = num_consumers
        self._batch_size = batch_size
        self._wait_seconds = wait_seconds
        self._queue = str(queue)
        self._exit_on_shutdown = exit_on_shutdown
        self._stop_on_shutdown = stop_on_shutdown
        self._idle = threading.Event()
        self._async = is_async_callable(process)
        self._async_failure = is_async_callable(on_permanent_failure)
        self._slots = _Slots(max_in_flight if self._async else num_consumers * batch_size)
        self._stop = threading.Event()
        self._leases = LeaseKeeper(f"{self._queue}-leases") if lease_extension else None
        self._loop = (
            LoopThread(f"{self._queue}-turns", stall_warning=stall_warning) if self._async else None
        )
        self._running = 0
        self._running_lock = threading.Lock()
        self._tails: dict[str, Future[None]] = {}  # last message handed out per group
        self._error_backoff = POLL_ERROR_BACKOFF_SECONDS
        self._isolation = _Isolation() if isolate_last_attempt and self._async else None
        self._consumer_retry = CONSUMER_RETRY_SECONDS
        self._drain_timeout = drain_timeout
        self._fetching = 0  # threads still in their fetch loop
        self._fetching_done = threading.Condition()
        self._log = RateLimitedLog(logger)
        self._redelivery = Redelivery(
            self._queue,
            base=retry_backoff,
            cap=max_retry_backoff,
            stopping=self.stopping,
            release=self._untrack,
            log=self._log,
        )
        self._outage = OutageRetry(self._queue, stopping=self.stopping, log=self._log)

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
            for i in range(self._num_consumers)
        ]

    def run(self, close: Iterable[Callable[[], None]] = ()) -> None:
        """Run the consumer threads until shutdown, then release clients; blocks.

        Args:
            close: ``close`` callables of the clients this loop used (transport, stores),
                called in order once the threads have drained, before the process exits.
        """
        ThreadRunner.run(
            self.tasks(), exit_on_shutdown=False, shutdown_timeout=self.shutdown_timeout
        )
        close_in_order(close)
        if self._exit_on_shutdown:
            ThreadRunner.exit_if_shutting_down()

    @property
    def shutdown_timeout(self) -> float:
        """Seconds after which a stopping loop is given up on.

        The drain, plus one fetch wait (a thread in a long poll finishes it before it stops),
        plus a margin for closing consumers.
        """
        return self._drain_timeout + self._wait_seconds + STOP_CHECK_SECONDS + 5.0

    def stop(self, drain_timeout: float | None = None) -> None:
        """Stop this loop only (finish in-flight work, then return from :meth:`run`).

        Args:
            drain_timeout: seconds to wait for the work in flight, instead of the loop's own
                ``drain_timeout`` (a caller whose shutdown budget is partly spent).
        """
        if drain_timeout is not None:
            self._drain_timeout = max(drain_timeout, 0.0)
        self._stop.set()

    def stopping(self) -> bool:
        """Whether the consumer threads should stop fetching."""
        if self._stop.is_set():
            return True
        return self._stop_on_shutdown and ThreadRunner.shutdown_event.is_set()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds until every consumer thread of this loop has finished.

        Returns:
            ``False`` when threads were still running at the timeout.
        """
        return self._idle.wait(timeout)

    # -- one consumer thread ---------------------------------------------------------------

    def consume(self) -> None:
        """Body of one consumer thread: fetch, hand out, and drain on shutdown."""
        with self._running_lock:
            self._running += 1
            self._idle.clear()
        consumer: TransportConsumer | None = None
        try:
            consumer = self._open_consumer()
            if consumer is not None:
                tracker = _Tracker()
                self._fetch_until_stopped(consumer, tracker)
                self._drain(consumer, tracker)
        finally:
            if consumer is not None:
                self._close(consumer)
            self._thread_finished()

    def _fetch_until_stopped(self, consumer: TransportConsumer, tracker: _Tracker) -> None:
        wait = min(self._wait_seconds, consumer.fetch_wait_slice_seconds or 1.0)
        with self._fetching_done:
            self._fetching += 1
        try:
            while not self.stopping():
                self._fetch_and_dispatch(consumer, tracker, wait)
        finally:
            try:
                consumer.stop_fetching()
            except Exception:
                logger.warning("stopping the fetches of %s failed", self._queue, exc_info=True)
            with self._fetching_done:
                self._fetching -= 1
                self._fetching_done.notify_all()

    def _open_consumer(self) -> TransportConsumer | None:
        """This thread's consumer, created again with back-off until it works or we stop.

        A configuration error (a missing stream, a bad setting) does not heal by waiting, so
        it is raised; ``None`` means the loop was stopped before a consumer could be made.
        """
        delay = self._consumer_retry
        while not self.stopping():
            try:
                return self._consumer_factory()
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

    def _drain(self, consumer: TransportConsumer, tracker: _Tracker) -> None:
        """Wait (bounded) for the messages in hand; hand back what is still unfinished.

        Nothing is handed back before every thread of the loop has stopped fetching: a sibling
        still fetching would take the message again, and each bounce costs a delivery.
        """
        if tracker.wait_idle(self._drain_timeout):
            return
        with self._fetching_done:
            self._fetching_done.wait_for(
                lambda: self._fetching == 0, self._wait_seconds + STOP_CHECK_SECONDS
            )
        for message in tracker.pending():
            logger.warning(
                "drain of %s timed out after %.1fs: message %s (request %s) is handed back",
                self._queue,
                self._drain_timeout,
                message.message_id,
                message.attributes.get(ATTR_REQUEST_ID, "-"),
            )
            self._untrack(message)
            self._redelivery.nack(consumer, message)
            tracker.cancel(message)  # its result would no longer count

    def _close(self, consumer: TransportConsumer) -> None:
        try:
            consumer.close()
        except Exception:
            logger.warning("closing a consumer of %s failed", self._queue, exc_info=True)

    def _sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, waking early when the loop stops."""
        deadline = time.monotonic() + seconds
        while not self.stopping() and (left := deadline - time.monotonic()) > 0:
            self._stop.wait(min(left, STOP_CHECK_SECONDS))

    def _fetch_and_dispatch(
        self, consumer: TransportConsumer, tracker: _Tracker, wait: float
    ) -> None:
        if self._isolation is not None and not self._isolation.fetch_open.wait(wait):
            return
        room = self._slots.take(self._batch_size, wait)
        if not room:
            return
        try:
            messages = consumer.fetch(room, wait)
        except Exception as exc:
            self._slots.give(room)
            self._log.log(
                logging.ERROR,
                f"{self._queue}:fetch:{type(exc).__name__}",
                "fetch from %s failed; retrying in %ss",
                self._queue,
                self._error_backoff,
                exc_info=True,
            )
            self._sleep(self._error_backoff)
            return
        self._slots.give(room - len(messages))
        for message in messages:
            tracker.add(message)
            if self._isolation is not None and self._suspect(message):
                self._isolation.admit()
            if self._loop is not None:
                self._submit(consumer, message, tracker)
            else:
                self._handle_inline(consumer, message, tracker)

    def _handle_inline(
        self, consumer: TransportConsumer, message: QueueMessage, tracker: _Tracker
    ) -> None:
        held: Future[None] | None = None
        try:
            held = self._handle(consumer, message)
        finally:
            self._slots.give()
            if held is None:
                tracker.done(message)
            else:  # a failed message waiting out its retry delay off this thread
                held.add_done_callback(lambda _: tracker.done(message))

    def _submit(
        self, consumer: TransportConsumer, message: QueueMessage, tracker: _Tracker
    ) -> None:
        group = message.group_id
        with self._running_lock:
            previous = self._tails.get(group) if group is not None else None
            future = self._loop.submit(  # type: ignore[union-attr]
                self._handle_async(consumer, message, previous)
            )
            if group is not None:
                self._tails[group] = future
        tracker.attach(message, future)
        future.add_done_callback(lambda f: self._finished(tracker, message, f))

    def _finished(self, tracker: _Tracker, message: QueueMessage, future: Future[None]) -> None:
        group = message.group_id
        if group is not None:
            with self._running_lock:
                if self._tails.get(group) is future:
                    del self._tails[group]
        self._settled(tracker, message)

    def _settled(self, tracker: _Tracker, message: QueueMessage) -> None:
        """An async message is done: free its in-flight place."""
        self._slots.give()
        tracker.done(message)

    def _thread_finished(self) -> None:
        with self._running_lock:
            self._running -= 1
            last = self._running == 0
        if last:
            self.release_resources()
            self._idle.set()

    # -- driven from an event loop (see :mod:`.in_loop`) -----------------------------------------

    def handling(self, consumer: TransportConsumer, message: QueueMessage) -> Awaitable[None]:
        """The whole handling of one fetched message, to run on the caller's event loop.

        The caller fetches (one message per group at a time) and keeps its own in-flight count;
        ``process`` must be ``async``.
        """
        if self._isolation is not None and self._suspect(message):
            self._isolation.admit()
        return self._handle_async(consumer, message, None)

    def fetch_open(self) -> bool:
        """False while a suspect message waits to run alone (see ``isolate_last_attempt``)."""
        return self._isolation is None or self._isolation.fetch_open.is_set()

    def hand_back(self, consumer: TransportConsumer, message: QueueMessage) -> None:
        """Give back a message whose handling did not finish within the drain."""
        self._untrack(message)
        self._redelivery.nack(consumer, message)

    def release_resources(self) -> None:
        """Stop the helper threads (lease keeper, event loop, holds) once nothing is in flight."""
        if self._leases is not None:
            self._leases.stop()
        if self._loop is not None:
            self._loop.stop()
        self._redelivery.stop()
        self._log.flush()

    # -- one message -------------------------------------------------------------------------

    def _suspect(self, message: QueueMessage) -> bool:
        return 1 < message.receive_count >= self._max_receive_count

    async def _isolated(self, fn: Handler, message: QueueMessage) -> None:
        work = functools.partial(self._acall, fn, message, self._is_async(fn))
        if self._isolation is None:
            await work()
        elif self._suspect(message):
            logger.info(
                "message %s on %s is on its last delivery (%s); running it alone",
                message.message_id,
                self._queue,
                message.receive_count,
            )
            await self._isolation.run_alone(work)
        else:
            await self._isolation.run_normal(work)

    def _count(self, message: QueueMessage) -> None:
        if message.receive_count > 1:
            METRICS.inc("agentkernel_redeliveries_total", queue=self._queue)
        if message.receive_count > self._max_receive_count:
            METRICS.inc("agentkernel_permanent_failures_total", queue=self._queue)

    def _handle(self, consumer: TransportConsumer, message: QueueMessage) -> Future[None] | None:
        """Handle one message on this thread; returns the pending hand-back of a failure."""
        self._count(message)
        self._track(consumer, message)
        try:
            if message.receive_count > self._max_receive_count:
                self._call(self._on_permanent_failure, message)
                self._untrack(message)
                consumer.dead_letter(message)
            else:
                self._call(self._process, message)
                self._untrack(message)
                consumer.ack(message)
        except Exception as exc:
            self._log_failure(message, exc)
            return self._redelivery.give_back(consumer, message)
        return None

    async def _handle_async(
        self, consumer: TransportConsumer, message: QueueMessage, after: Future[None] | None
    ) -> None:
        self._count(message)
        self._track(consumer, message)
        if after is not None:
            logger.debug("message %s waits for the one before it", message.message_id)
            await asyncio.wait([asyncio.wrap_future(after)])  # same group: strictly one by one
        logger.debug("handling %s (delivery %s)", message.message_id, message.receive_count)
        try:
            if message.receive_count > self._max_receive_count:
                await self._isolated(self._on_permanent_failure, message)
                self._untrack(message)
                await call(consumer.nonblocking, consumer.dead_letter, message)
            else:
                await self._isolated(self._process, message)
                self._untrack(message)
                await call(consumer.nonblocking, consumer.ack, message)
                logger.debug("acked %s", message.message_id)
        except Exception as exc:
            self._log_failure(message, exc)
            await self._redelivery.give_back_async(consumer, message)

    def _call(self, fn: Handler, message: QueueMessage) -> None:
        """Call ``fn`` on this thread; tried again in place while a store is down."""
        self._outage.call(message, functools.partial(_run, fn, message))

    def _is_async(self, fn: Handler) -> bool:
        """Whether ``fn`` is async, known from construction for the two handlers (no inspect)."""
        if fn is self._process:
            return self._async
        if fn is self._on_permanent_failure:
            return self._async_failure
        return is_async_callable(fn)

    async def _acall(self, fn: Handler, message: QueueMessage, is_async: bool) -> None:
        """Await ``fn`` (a sync one on a worker thread); tried again while a store is down."""
        work = functools.partial(fn, message) if is_async else _in_thread(fn, message)
        await self._outage.call_async(message, work)

    def _track(self, consumer: TransportConsumer, message: QueueMessage) -> None:
        if self._leases is not None:
            self._leases.track(consumer, message)

    def _untrack(self, message: QueueMessage) -> None:
        if self._leases is not None:
            self._leases.untrack(message)

    def _log_failure(self, message: QueueMessage, exc: Exception) -> None:
        self._log.log(
            logging.WARNING,
            f"{self._queue}:{type(exc).__name__}",
            "message %s on %s (request %s, delivery %s) failed; it is delivered again in %.1fs",
            message.message_id,
            self._queue,
            message.attributes.get(ATTR_REQUEST_ID, "-"),
            message.receive_count,
            self._redelivery.delay(message),
            exc_info=True,
        )


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _run(fn: Handler, message: QueueMessage) -> None:
    """Call ``fn`` on this thread, running it to the end if it returns an awaitable."""
    result = fn(message)
    if inspect.isawaitable(result):
        asyncio.run(_await(result))


def _in_thread(fn: Handler, message: QueueMessage) -> Callable[[], Awaitable[Any]]:
    return lambda: asyncio.to_thread(fn, message)
