"""The in-memory 'server' behind :class:`~.in_memory.InMemoryTransport`: its queues and clock.

:class:`Broker` applies the delivery rules (per-group FIFO, leases with tokens, dedup windows,
delayed redelivery) to the state of each queue (:mod:`.in_memory_queue`) under that queue's lock.
Time comes from a clock callable so tests can move it (:class:`ManualClock`) instead of sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from agentkernel.pipeline.runtime.event_loop import resolve_soon
from agentkernel.pipeline.transport.in_memory_queue import Entry, Handle, Lease, MemoryQueue
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from agentkernel.pipeline.wire.position import Position

Clock = Callable[[], float]


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


class Broker:
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
        handle = _handle(message)
        q = handle.queue
        with q.cond:
            if (lease := q.current(handle)) is None:
                return  # stale handle: the lease expired and the message was handed out again
            q.release(handle.group)
            if requeue:
                q.push(handle.group, lease.entry, head=True)
            if q.ready:
                q.notify()

    def hold(self, message: QueueMessage, seconds: float) -> None:
        """Let the message's lease run out in ``seconds``, then redeliver it (a delayed nack)."""
        handle = _handle(message)
        with handle.queue.cond:
            if (lease := handle.queue.current(handle)) is not None:
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
            if (lease := handle.queue.current(handle)) is not None:
                lease.deadline = self.clock() + self.ack_wait
                handle.queue.schedule(handle.group, lease)


def _handle(message: QueueMessage) -> Handle:
    if not isinstance(message.native, Handle):
        raise ValueError("message was not fetched from an in-memory transport")
    return message.native


def _copy(message: QueueMessage, **changes: Any) -> QueueMessage:
    """``message.model_copy(update=changes)`` without its per-call overhead (three times
    slower, and a message is copied twice per queue): the values are already valid ones."""
    copy = message.__copy__()
    copy.__dict__.update(changes)
    copy.__pydantic_fields_set__.update(changes)
    return copy
