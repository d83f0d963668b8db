"""The in-process transport: the pipeline's delivery semantics with no broker.

Each queue keeps a FIFO of pending messages per group and lets at most one message per group be
in flight. A fetched message carries a lease token; when its lease (``ack_wait``) runs out it goes
back to the head of its group with ``receive_count + 1`` and the old token stops working, so a late
ack or nack from the previous holder is a harmless no-op (as a stale SQS receipt handle is).
Nothing is durable: messages live only as long as the process.

A consumer on an event loop (the embedded topology's in-loop consumers) waits with
:meth:`InMemoryConsumer.wait_ready` instead of a blocking fetch: the broker wakes it when a message
becomes ready, with no thread in between.

The queues and the delivery rules are in :mod:`.in_memory_broker`; time comes from a clock
callable so tests can move it (:class:`ManualClock`) instead of sleeping.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import ClassVar

from agentkernel.core.config.queues import InMemoryQueueConfig, QueuesConfig
from agentkernel.core.errors import TransportClosedError
from agentkernel.pipeline.transport.blocking import BlockingConsumer, BlockingTransport
from agentkernel.pipeline.transport.in_memory_broker import Broker, Clock, ManualClock
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

__all__ = ["DEFAULT_SECONDS", "InMemoryConsumer", "InMemoryTransport", "ManualClock"]

logger = logging.getLogger(__name__)

#: Default lease and dedup window of the in-memory queues, in seconds.
DEFAULT_SECONDS = 300.0


class InMemoryTransport(BlockingTransport):
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
    _shared: ClassVar[Broker | None] = None
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
        self._checked: Broker | None = None  # the queues whose settings were compared

    @property
    def _broker(self) -> Broker:
        broker = InMemoryTransport._shared
        if broker is None:
            with InMemoryTransport._shared_lock:
                if (broker := InMemoryTransport._shared) is None:
                    ack_wait, dedup_window, clock = self._wanted
                    broker = InMemoryTransport._shared = Broker(
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


class InMemoryConsumer(BlockingConsumer):
    """A consumer of one in-memory queue."""

    nonblocking = True
    #: Waiting costs nothing here, so short slices make shutdown quick.
    fetch_wait_slice_seconds = 0.25

    def __init__(self, broker: Broker, queue: QueueName) -> None:
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
        """Whether ``message``, not yet sent, may be handled at once by this consumer's owner (see
        :meth:`~.in_memory_broker.Broker.claim`): ``None`` a duplicate, ``False`` send it,
        ``True`` taken."""
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


def _warn_if_other_settings(
    broker: Broker, wanted: tuple[float | None, float | None, Clock | None]
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
