"""The in-process transport: the pipeline's delivery semantics with no broker.

Each queue keeps a FIFO of pending messages per group and lets at most one message per group be
in flight. A fetched message carries a lease token; when its lease (``ack_wait``) runs out it goes
back to the head of its group with ``receive_count + 1`` and the old token stops working, so a late
ack or nack from the previous holder is a harmless no-op (as a stale SQS receipt handle is).
Nothing is durable: messages live only as long as the process.

A consumer on an event loop (the embedded topology's in-loop consumers) waits with
:meth:`InMemoryConsumer.wait_ready` instead of a blocking fetch: the broker wakes it when a message
becomes ready, with no thread in between.

Time comes from a clock callable so tests can move it (:class:`ManualClock`) instead of sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

from agentkernel.core.config.queues import InMemoryQueueConfig, QueuesConfig
from agentkernel.core.errors import TransportClosedError
from agentkernel.pipeline.runtime.event_loop import resolve_soon
from agentkernel.pipeline.transport.base import QueueTransport, TransportConsumer
from agentkernel.pipeline.transport.in_memory_queue import Entry, Handle, Lease, MemoryQueue
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from agentkernel.pipeline.wire.position import Position

Clock = Callable[[], float]
logger = logging.getLogger(__name__)

#: Default lease and dedup window of the in-memory queues, in seconds.
DEFAULT_SECONDS = 300.0


class ManualClock:
    """A clock that only moves when told to; for tests of leases and dedup windows."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        with self._lock:
            self._now += seconds


class _Broker:
    """All queues of one in-memory 'server'."""

    def __init__(self, ack_wait: float, dedup_window: float, clock: Clock) -> None:
        self.ack_wait = ack_wait
        self.dedup_window = dedup_window
        self.clock = clock
        self.queues = {name: MemoryQueue() for name in QueueName}
        self._tokens = itertools.count(1)  # next() is atomic under the GIL
        # Message ids: unique per broker, without a system call for randomness per message.
        self._id_prefix = uuid.uuid4().hex[:16]
        self._ids = itertools.count(1)

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        q = self.queues[queue]
        with q.cond:
            now = self.clock()
            if message.dedup_id is not None and self._is_duplicate(q, message.dedup_id, now):
                return None
            number = next(self._ids)
            stored = _copy(
                message,
                attributes=dict(message.attributes),
                message_id=f"{self._id_prefix}{number:016x}",
                receive_count=1,
                native=None,
                # The random prefix names this broker's life: a new one counts from 1 again.
                position=Position(f"memory:{self._id_prefix}:{queue}", number),
            )
            group = message.group_id if message.group_id is not None else f"\0{stored.message_id}"
            q.push(group, Entry(stored))
            q.notify()
            return stored.message_id

    def claim(self, queue: QueueName, message: QueueMessage) -> bool | None:
        """Whether ``message`` may be handled at once instead of sent: what :meth:`send`
        would do, had a consumer fetched it the moment it was sent.

        Returns ``None`` for a duplicate (dropped, as the send would drop it), ``False`` while
        its group has a message queued or in flight (it must wait behind them: send it), and
        ``True`` when it is taken: its dedup id counts as sent, unless :meth:`unclaim` gives it
        back.
        """
        q = self.queues[queue]
        with q.cond:
            group = message.group_id
            if group is not None and (group in q.leased or q.pending.get(group)):
                return False
            duplicate = message.dedup_id is not None and self._is_duplicate(
                q, message.dedup_id, self.clock()
            )
            return None if duplicate else True

    def unclaim(self, queue: QueueName, message: QueueMessage) -> None:
        """Forget the dedup id of a claimed ``message`` that was not handled (it is sent next)."""
        if message.dedup_id is None:
            return
        q = self.queues[queue]
        with q.cond:
            q.dedup.pop(message.dedup_id, None)  # its dedup_order entry expires on its own

    def _is_duplicate(self, q: MemoryQueue, dedup_id: str, now: float) -> bool:
        while q.dedup_order and q.dedup_order[0][0] <= now:  # ids expire in the order sent
            expires, old = q.dedup_order.popleft()
            if q.dedup.get(old) == expires:
                del q.dedup[old]
        if dedup_id in q.dedup:
            return True
        q.dedup[dedup_id] = now + self.dedup_window
        q.dedup_order.append((q.dedup[dedup_id], dedup_id))
        return False

    def fetch(self, queue: QueueName, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        give_up = time.monotonic() + max(wait_seconds, 0.0)
        q = self.queues[queue]
        with q.cond:
            while True:
                self._expire_leases(q)
                if q.ready:
                    return [self._lease(q) for _ in range(min(batch_size, len(q.ready)))]
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    return []
                q.cond.wait(min(remaining, self._until_next_expiry(q)))

    async def wait_ready(self, queue: QueueName, wait_seconds: float) -> None:
        """On an event loop: wait until a fetch may return a message, at most ``wait_seconds``."""
        q = self.queues[queue]
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with q.cond:
            self._expire_leases(q)
            if q.ready:
                return
            wait_seconds = min(wait_seconds, self._until_next_expiry(q))
            q.waiters.append((loop, future))
        timer = loop.call_later(max(wait_seconds, 0.0), resolve_soon, loop, future)
        try:
            await future
        finally:
            timer.cancel()
            with q.cond:
                if (loop, future) in q.waiters:  # woken by the timer, not the broker
                    q.waiters.remove((loop, future))

    def _until_next_expiry(self, q: MemoryQueue) -> float:
        soonest = q.soonest_expiry()
        if soonest is None:
            return 3600.0
        return max(soonest - self.clock(), 0.001)

    def _expire_leases(self, q: MemoryQueue) -> None:
        now = self.clock()
        while (soonest := q.soonest_expiry()) is not None and soonest <= now:
            _, _, group = heapq.heappop(q.expiries)
            lease = q.leased[group]
            q.release(group)
            q.push(group, lease.entry, head=True)

    def _lease(self, q: MemoryQueue) -> QueueMessage:
        group = q.ready.popleft()
        entry = q.pending[group].popleft()
        entry.deliveries += 1
        token = next(self._tokens)
        q.lease(group, Lease(entry, token, self.clock() + self.ack_wait))
        message = entry.message
        return _copy(
            message,
            attributes=dict(message.attributes),
            receive_count=entry.deliveries,
            native=Handle(q, group, token),
        )

    def settle(self, message: QueueMessage, *, requeue: bool) -> None:
        handle = message.native
        if not isinstance(handle, Handle):
            raise ValueError("message was not fetched from an in-memory transport")
        q = handle.queue
        with q.cond:
            lease = q.leased.get(handle.group)
            if lease is None or lease.token != handle.token:
                return  # stale handle: the lease expired and the message was handed out again
            q.release(handle.group)
            if requeue:
                q.push(handle.group, lease.entry, head=True)
            if q.ready:
                q.notify()

    def hold(self, message: QueueMessage, seconds: float) -> None:
        """Let the message's lease run out in ``seconds``, then redeliver it (a delayed nack)."""
        handle = message.native
        if not isinstance(handle, Handle):
            raise ValueError("message was not fetched from an in-memory transport")
        with handle.queue.cond:
            lease = handle.queue.leased.get(handle.group)
            if lease is not None and lease.token == handle.token:
                lease.token = next(self._tokens)  # the holder's handle is spent
                lease.deadline = self.clock() + max(seconds, 0.0)
                handle.queue.schedule(handle.group, lease)
                handle.queue.notify(everyone=True)  # fetchers recompute their wake-up time

    def purge(self, queue: QueueName) -> list[QueueMessage]:
        """Remove and return every message of ``queue``, queued or in flight."""
        q = self.queues[queue]
        with q.cond:
            entries = [lease.entry for lease in q.leased.values()]
            entries += [entry for bucket in q.pending.values() for entry in bucket]
            q.leased.clear()
            q.pending.clear()
            q.ready.clear()
            q.expiries.clear()
        return [entry.message for entry in entries]

    def extend(self, message: QueueMessage) -> None:
        handle = message.native
        if not isinstance(handle, Handle):
            return
        with handle.queue.cond:
            lease = handle.queue.leased.get(handle.group)
            if lease is not None and lease.token == handle.token:
                lease.deadline = self.clock() + self.ack_wait
                handle.queue.schedule(handle.group, lease)


class InMemoryTransport(QueueTransport):
    """A thread-safe in-process broker with the full delivery semantics.

    Args:
        ack_wait: seconds a fetched message stays invisible before it is redelivered.
        dedup_window: seconds during which a repeated ``dedup_id`` is dropped at send.
        clock: monotonic time source in seconds (tests pass a :class:`ManualClock`).

    The queues are process-wide, as the transport guide has them: every instance, whenever it
    was made, sends to and consumes from the same two queues, so a producer and a consumer
    built apart still meet. Whichever instance first needs the queues creates them with its
    settings (``None``: 300 s each, real time); an instance that asks for other settings later
    gets a warning and the queues as they are. :meth:`reset` drops the queues (tests).
    """

    nonblocking = True
    queues_in_process = True
    _shared: ClassVar[_Broker | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        ack_wait: float | None = None,
        dedup_window: float | None = None,
        clock: Clock | None = None,
    ) -> None:
        for name, value in (("ack_wait", ack_wait), ("dedup_window", dedup_window)):
            if value is not None and not value >= 0:  # also refuses NaN
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        self._wanted = (ack_wait, dedup_window, clock)
        self._checked: _Broker | None = None  # the queues whose settings were compared

    @property
    def _broker(self) -> _Broker:
        broker = InMemoryTransport._shared
        if broker is None:
            with InMemoryTransport._shared_lock:
                if (broker := InMemoryTransport._shared) is None:
                    ack_wait, dedup_window, clock = self._wanted
                    broker = InMemoryTransport._shared = _Broker(
                        DEFAULT_SECONDS if ack_wait is None else ack_wait,
                        DEFAULT_SECONDS if dedup_window is None else dedup_window,
                        time.monotonic if clock is None else clock,
                    )
        if broker is not self._checked:
            self._checked = broker
            _warn_if_other_settings(broker, self._wanted)
        return broker

    @classmethod
    def from_config(cls, block: QueuesConfig) -> InMemoryTransport:
        """The process-wide queues, tuned by ``execution.queues.in_memory``."""
        tuning = block.in_memory or InMemoryQueueConfig()
        return cls.shared(tuning.ack_wait, tuning.dedup_window)

    @classmethod
    def shared(
        cls, ack_wait: float = DEFAULT_SECONDS, dedup_window: float = DEFAULT_SECONDS
    ) -> InMemoryTransport:
        """A transport over the process-wide queues (created on first use with these settings)."""
        transport = cls(ack_wait, dedup_window)
        transport._broker  # noqa: B018 - creates the queues with these settings if none exist
        return transport

    @classmethod
    def reset(cls) -> None:
        """Drop the process-wide queues and everything on them (tests).

        Instances made before keep working: they use new, empty queues from then on (a
        consumer created before keeps the queue it was created on).
        """
        with cls._shared_lock:
            InMemoryTransport._shared = None

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        return self._broker.send(QueueName(queue), message)

    def create_consumer(self, queue: QueueName) -> InMemoryConsumer:
        return InMemoryConsumer(self._broker, QueueName(queue))

    def open_consumers(self, queue: QueueName) -> int:
        """How many consumers of ``queue`` are open (lets tests check ``close()``)."""
        q = self._broker.queues[queue]
        with q.cond:
            return q.consumers

    def depth(self, queue: QueueName) -> int:
        """Messages waiting on ``queue``, not counting those in flight."""
        q = self._broker.queues[queue]
        with q.cond:
            return sum(len(bucket) for bucket in q.pending.values())

    def in_flight(self, queue: QueueName) -> int:
        """Messages of ``queue`` fetched and not yet settled (or waiting out a delayed nack)."""
        q = self._broker.queues[queue]
        with q.cond:
            return len(q.leased)

    def purge(self, queue: QueueName) -> list[QueueMessage]:
        """Remove every message of ``queue`` (queued or in flight) and return them.

        The embedded topology calls it once its drain is over, to log each turn that could not
        be run before the process ends; nothing here outlives the process.
        """
        return self._broker.purge(QueueName(queue))


class InMemoryConsumer(TransportConsumer):
    """A consumer of one in-memory queue."""

    nonblocking = True
    #: Waiting costs nothing here, so short slices make shutdown quick.
    fetch_wait_slice_seconds = 0.25

    def __init__(self, broker: _Broker, queue: QueueName) -> None:
        self._broker = broker
        self._queue = queue
        self._closed = False
        with broker.queues[queue].cond:
            broker.queues[queue].consumers += 1

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        if self._closed:
            raise TransportClosedError(f"consumer of {self._queue} is closed")
        return self._broker.fetch(self._queue, batch_size, wait_seconds)

    async def wait_ready(self, wait_seconds: float) -> None:
        """Wait on the running event loop until :meth:`fetch` may return a message.

        Returns when a message is ready, a lease ran out, or after ``wait_seconds``.
        """
        await self._broker.wait_ready(self._queue, wait_seconds)

    def claim(self, message: QueueMessage) -> bool | None:
        """Whether ``message``, not yet sent, may be handled at once by this consumer's owner
        (see :meth:`_Broker.claim`): ``None`` a duplicate, ``False`` send it, ``True`` taken."""
        if self._closed:
            return False
        return self._broker.claim(self._queue, message)

    def unclaim(self, message: QueueMessage) -> None:
        """Give back a claimed ``message`` that could not be handled, before it is sent."""
        self._broker.unclaim(self._queue, message)

    def ack(self, message: QueueMessage) -> None:
        self._broker.settle(message, requeue=False)

    def nack(self, message: QueueMessage) -> None:
        self._broker.settle(message, requeue=True)

    def nack_later(self, message: QueueMessage, delay_seconds: float) -> bool:
        self._broker.hold(message, delay_seconds)
        return True

    @property
    def lease_seconds(self) -> float:
        return self._broker.ack_wait

    def extend_lease(self, message: QueueMessage) -> None:
        self._broker.extend(message)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._broker.queues[self._queue].cond:
            self._broker.queues[self._queue].consumers -= 1


def _copy(message: QueueMessage, **changes: Any) -> QueueMessage:
    """``message.model_copy(update=changes)`` without its per-call overhead (three times
    slower, and a message is copied twice per queue): the values are already valid ones."""
    copy = message.__copy__()
    copy.__dict__.update(changes)
    copy.__pydantic_fields_set__.update(changes)
    return copy


def _warn_if_other_settings(
    broker: _Broker, wanted: tuple[float | None, float | None, Clock | None]
) -> None:
    """Say so when an instance asked for settings other than those the queues were made with."""
    ack_wait, dedup_window, clock = wanted
    if (
        (ack_wait is not None and ack_wait != broker.ack_wait)
        or (dedup_window is not None and dedup_window != broker.dedup_window)
        or (clock is not None and clock is not broker.clock)
    ):
        logger.warning(
            "in-memory queues already exist (ack_wait %ss, dedup_window %ss); this transport's "
            "other settings are ignored (InMemoryTransport.reset() makes new queues)",
            broker.ack_wait,
            broker.dedup_window,
        )
