"""Consuming a queue: the :class:`ConsumerLoop` and the :class:`QueueConsumer` base.

Per message the loop does what the SQS FIFO pipeline did: a message delivered more than
``max_receive_count`` times goes to the permanent-failure hook (which answers the caller) and is
dead-lettered; otherwise it is processed and acknowledged; a failure nacks it so the transport
redelivers it. An ``async`` process function lets one loop keep up to ``max_in_flight`` messages
running at once on a private event loop, whatever the number of consumer threads; per-session
order still holds because the transport releases a group only when its message is acknowledged.
A fetch may return several messages of one group (SQS FIFO batches do); the loop then handles
each only after the previous one of its group has been settled.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

from agentkernel.pipeline.blocking import call
from agentkernel.pipeline.envelope import QueueMessage, QueueName
from agentkernel.pipeline.event_loop import LoopThread
from agentkernel.pipeline.lease import LeaseKeeper
from agentkernel.pipeline.metrics import METRICS
from agentkernel.pipeline.thread_runner import ThreadRunner
from agentkernel.pipeline.transport.base import TransportConsumer

logger = logging.getLogger(__name__)

Handler = Callable[[QueueMessage], Any] | Callable[[QueueMessage], Awaitable[Any]]

POLL_ERROR_BACKOFF_SECONDS = 5.0


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """True for ``async def`` functions, bound methods and partials of them."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    )


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
        self._count = 0
        self._cond = threading.Condition()

    def add(self) -> None:
        with self._cond:
            self._count += 1

    def done(self) -> None:
        with self._cond:
            self._count -= 1
            self._cond.notify_all()

    def wait_idle(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._count == 0)


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
                async with changed:
                    await changed.wait_for(lambda: self._active == 0)
                await work()
        finally:
            self._release()

    async def run_normal(self, work: Callable[[], Awaitable[None]]) -> None:
        # Never held back: a message fetched before the suspect should finish before it runs
        # (and so be out of the way if the suspect crashes the process).
        changed = self._condition()
        self._active += 1
        try:
            await work()
        finally:
            async with changed:
                self._active -= 1
                changed.notify_all()


class ConsumerLoop:
    """Run ``num_consumers`` threads that fetch from one queue and handle each message.

    Args:
        process: handles one message; sync or ``async``. Raising nacks the message.
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
    ) -> None:
        if num_consumers < 1 or batch_size < 1 or max_in_flight < 1:
            raise ValueError("num_consumers, batch_size and max_in_flight must be at least 1")
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

    def run(self) -> None:
        """Run the consumer threads until shutdown; blocks."""
        ThreadRunner.run(self.tasks(), exit_on_shutdown=self._exit_on_shutdown)

    def stop(self) -> None:
        """Stop this loop only (finish in-flight work, then return from :meth:`run`)."""
        self._stop.set()

    def stopping(self) -> bool:
        """Whether the consumer threads should stop fetching."""
        if self._stop.is_set():
            return True
        return self._stop_on_shutdown and ThreadRunner.shutdown_event.is_set()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Wait until every consumer thread of this loop has finished."""
        return self._idle.wait(timeout)

    # -- one consumer thread ---------------------------------------------------------------

    def consume(self) -> None:
        """Body of one consumer thread: fetch, hand out, and drain on shutdown."""
        with self._running_lock:
            self._running += 1
            self._idle.clear()
        consumer = self._consumer_factory()
        tracker = _Tracker()
        wait = min(self._wait_seconds, consumer.fetch_wait_slice_seconds or 1.0)
        try:
            while not self.stopping():
                self._fetch_and_dispatch(consumer, tracker, wait)
            tracker.wait_idle()
        finally:
            consumer.close()
            self._thread_finished()

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
        except Exception:
            self._slots.give(room)
            logger.exception(
                "fetch from %s failed; retrying in %ss", self._queue, self._error_backoff
            )
            self._stop.wait(self._error_backoff)
            return
        self._slots.give(room - len(messages))
        for message in messages:
            tracker.add()
            if self._isolation is not None and self._suspect(message):
                self._isolation.admit()
            if self._loop is not None:
                self._submit(consumer, message, tracker)
            else:
                try:
                    self._handle(consumer, message)
                finally:
                    self._settled(tracker)

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
        future.add_done_callback(lambda f: self._finished(tracker, group, f))

    def _finished(self, tracker: _Tracker, group: str | None, future: Future[None]) -> None:
        if group is not None:
            with self._running_lock:
                if self._tails.get(group) is future:
                    del self._tails[group]
        self._settled(tracker)

    def _settled(self, tracker: _Tracker) -> None:
        self._slots.give()
        tracker.done()

    def _thread_finished(self) -> None:
        with self._running_lock:
            self._running -= 1
            last = self._running == 0
        if last:
            if self._leases is not None:
                self._leases.stop()
            if self._loop is not None:
                self._loop.stop()
            self._idle.set()

    # -- one message -------------------------------------------------------------------------

    def _suspect(self, message: QueueMessage) -> bool:
        return 1 < message.receive_count >= self._max_receive_count

    async def _isolated(self, fn: Handler, message: QueueMessage) -> None:
        work = functools.partial(self._acall, fn, message)
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

    def _handle(self, consumer: TransportConsumer, message: QueueMessage) -> None:
        self._count(message)
        self._track(consumer, message)
        try:
            if message.receive_count > self._max_receive_count:
                self._call(self._on_permanent_failure, message)
                self._untrack(message)
                consumer.dead_letter(message)
            else:
                self._process(message)
                self._untrack(message)
                consumer.ack(message)
        except Exception:
            self._untrack(message)
            self._log_failure(message)
            self._safe_nack(consumer, message)

    async def _handle_async(
        self, consumer: TransportConsumer, message: QueueMessage, after: Future[None] | None
    ) -> None:
        self._count(message)
        self._track(consumer, message)
        if after is not None:
            await asyncio.wait([asyncio.wrap_future(after)])  # same group: strictly one by one
        try:
            if message.receive_count > self._max_receive_count:
                await self._isolated(self._on_permanent_failure, message)
                self._untrack(message)
                await call(consumer.nonblocking, consumer.dead_letter, message)
            else:
                await self._isolated(self._process, message)
                self._untrack(message)
                await call(consumer.nonblocking, consumer.ack, message)
        except Exception:
            self._untrack(message)
            self._log_failure(message)
            await call(consumer.nonblocking, self._safe_nack, consumer, message)

    @staticmethod
    def _call(fn: Handler, message: QueueMessage) -> None:
        result = fn(message)
        if inspect.isawaitable(result):
            asyncio.run(_await(result))

    @staticmethod
    async def _acall(fn: Handler, message: QueueMessage) -> None:
        if is_async_callable(fn):
            await fn(message)
        else:
            await asyncio.to_thread(fn, message)

    def _track(self, consumer: TransportConsumer, message: QueueMessage) -> None:
        if self._leases is not None:
            self._leases.track(consumer, message)

    def _untrack(self, message: QueueMessage) -> None:
        if self._leases is not None:
            self._leases.untrack(message)

    def _log_failure(self, message: QueueMessage) -> None:
        logger.warning(
            "message %s on %s (delivery %s) failed; leaving it for redelivery",
            message.message_id,
            self._queue,
            message.receive_count,
            exc_info=True,
        )

    def _safe_nack(self, consumer: TransportConsumer, message: QueueMessage) -> None:
        try:
            consumer.nack(message)
        except Exception:
            logger.exception("nack of %s on %s failed", message.message_id, self._queue)


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


class QueueConsumer(ABC):
    """A component that consumes one queue (Agent Runner, response handler, Lambda consumers).

    Subclasses say what to do with a message and what to do when it keeps failing. ``poll`` and
    ``delete_message`` are for consumers that drive a broker themselves; push-driven ones (an SQS
    event source mapping on Lambda) leave them unimplemented.
    """

    @abstractmethod
    def process_message(self, message: QueueMessage) -> Any:
        """Handle one message (may be ``async``); raising makes it be delivered again."""

    @abstractmethod
    def on_permanent_failure(self, message: QueueMessage) -> Any:
        """Answer the caller of a message that exhausted its deliveries (may be ``async``)."""

    def poll(self, batch_size: int = 1, wait_seconds: float = 1.0) -> list[QueueMessage]:
        """Fetch messages from the broker; not available on push-driven consumers."""
        raise NotImplementedError(f"{type(self).__name__} does not poll")

    def delete_message(self, message: QueueMessage) -> None:
        """Remove a handled message from the broker; not available on push-driven consumers."""
        raise NotImplementedError(f"{type(self).__name__} does not delete messages")
