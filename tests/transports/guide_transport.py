"""A transport written the way a user writes one from the transport guide, and nothing more.

It gives the guide's six guarantees over plain dicts and deques and implements only what the
guide lists: ``send`` and ``create_consumer``; ``fetch``, ``ack``, ``nack``, ``dead_letter``, and
``close`` where there is something to release (here there is not). No ``nack_later``, no
``extend_lease``, no ``lease_seconds``, no positions, no ``stop_fetching``; real time only.
Its queues are class-level with a ``reset()`` for tests, as the guide asks. The contract suite
must pass on it without a single capability flag.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import deque
from typing import ClassVar

from agentkernel.pipeline.transport.base import QueueTransport, TransportConsumer
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName


class _Queue:
    """One queue: pending messages per group, at most one in flight per group."""

    def __init__(self, ack_wait: float, dedup_window: float) -> None:
        self.ack_wait, self.dedup_window = ack_wait, dedup_window
        self.cond = threading.Condition()
        self.groups: dict[str, deque[QueueMessage]] = {}
        self.in_flight: dict[str, tuple[QueueMessage, float]] = {}  # group -> (held, deadline)
        self.seen: dict[str, float] = {}  # dedup id -> when it may be used again
        self.synthetic = itertools.count()

    def send(self, message: QueueMessage) -> str | None:
        with self.cond:
            now = time.monotonic()
            self.seen = {k: t for k, t in self.seen.items() if t > now}
            if message.dedup_id is not None:
                if message.dedup_id in self.seen:
                    return None
                self.seen[message.dedup_id] = now + self.dedup_window
            stored = message.model_copy(
                update={"attributes": dict(message.attributes), "message_id": uuid.uuid4().hex}
            )
            group = message.group_id or f"__single-{next(self.synthetic)}"
            self.groups.setdefault(group, deque()).append(stored)
            self.cond.notify_all()
            return stored.message_id

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        deadline = time.monotonic() + wait_seconds
        with self.cond:
            while True:
                self._expire()
                ready = [g for g, q in self.groups.items() if q and g not in self.in_flight]
                if ready:
                    return [self._lease(group) for group in ready[:batch_size]]
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self.cond.wait(min(left, 0.05))

    def _lease(self, group: str) -> QueueMessage:
        head = self.groups[group].popleft()
        self.in_flight[group] = (head, time.monotonic() + self.ack_wait)
        return head

    def _expire(self) -> None:
        now = time.monotonic()
        for group, (held, due) in list(self.in_flight.items()):
            if due <= now:
                self._requeue(group, held)

    def _requeue(self, group: str, held: QueueMessage) -> None:
        del self.in_flight[group]
        again = held.model_copy(update={"receive_count": held.receive_count + 1})
        self.groups[group].appendleft(again)  # a copy: the old object is a stale handle now
        self.cond.notify_all()

    def settle(self, message: QueueMessage, requeue: bool) -> None:
        with self.cond:
            group = message.group_id or next(
                (g for g, (held, _) in self.in_flight.items() if held is message), None
            )
            held = self.in_flight.get(group) if group is not None else None
            if group is None or held is None or held[0] is not message:
                return  # stale: its lease ran out and a copy was handed out again
            if requeue:
                self._requeue(group, message)
            else:
                del self.in_flight[group]
                self.cond.notify_all()


class GuideTransport(QueueTransport):
    """INPUT and OUTPUT as two class-level in-process queues."""

    _queues: ClassVar[dict[QueueName, _Queue]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, ack_wait: float = 300.0, dedup_window: float = 300.0) -> None:
        self.ack_wait, self.dedup_window = ack_wait, dedup_window

    @classmethod
    def reset(cls) -> None:
        with cls._lock:
            cls._queues.clear()

    def _queue(self, queue: QueueName) -> _Queue:
        with self._lock:
            if queue not in self._queues:
                self._queues[queue] = _Queue(self.ack_wait, self.dedup_window)
            return self._queues[queue]

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        return self._queue(queue).send(message)

    def create_consumer(self, queue: QueueName) -> TransportConsumer:
        return GuideConsumer(self._queue(queue))


class GuideConsumer(TransportConsumer):
    """One consumer thread's view of a queue; nothing to release."""

    def __init__(self, queue: _Queue) -> None:
        self._queue = queue

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        return self._queue.fetch(batch_size, wait_seconds)

    def ack(self, message: QueueMessage) -> None:
        self._queue.settle(message, requeue=False)

    def nack(self, message: QueueMessage) -> None:
        self._queue.settle(message, requeue=True)

    def dead_letter(self, message: QueueMessage) -> None:
        self.ack(message)

    # No close(): it holds no connection, subscription or thread, so the base no-op stands.
