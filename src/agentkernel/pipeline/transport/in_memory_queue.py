"""The state of one in-memory queue: pending messages per group, leases, dedup ids, waiters.

:class:`~agentkernel.pipeline.transport.in_memory.InMemoryTransport` holds one per queue and
implements the delivery rules on top of it.
"""

from __future__ import annotations

import asyncio
import heapq
import threading
from collections import deque
from dataclasses import dataclass, field

from agentkernel.pipeline.runtime.event_loop import resolve_soon
from agentkernel.pipeline.wire.envelope import QueueMessage


@dataclass
class Entry:
    message: QueueMessage
    deliveries: int = 0


@dataclass
class Lease:
    entry: Entry
    token: int
    deadline: float


@dataclass(frozen=True)
class Handle:
    queue: MemoryQueue
    group: str
    token: int


@dataclass
class MemoryQueue:
    """One queue's state, guarded by its own condition."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    pending: dict[str, deque[Entry]] = field(default_factory=dict)
    ready: deque[str] = field(default_factory=deque)
    leased: dict[str, Lease] = field(default_factory=dict)
    dedup: dict[str, float] = field(default_factory=dict)
    dedup_order: deque[tuple[float, str]] = field(default_factory=deque)  # by expiry
    #: (deadline, token, group) of every lease; entries of settled or moved leases are skipped.
    expiries: list[tuple[float, int, str]] = field(default_factory=list)
    #: Event-loop consumers waiting for a message: woken on the next notify.
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = field(
        default_factory=list
    )
    consumers: int = 0

    def push(self, group: str, entry: Entry, *, head: bool = False) -> None:
        bucket = self.pending.setdefault(group, deque())
        was_empty = not bucket
        (bucket.appendleft if head else bucket.append)(entry)
        if was_empty and group not in self.leased:
            (self.ready.appendleft if head else self.ready.append)(group)

    def release(self, group: str) -> None:
        """The group's in-flight message is gone; let its next message be fetched."""
        del self.leased[group]
        if self.pending.get(group):
            self.ready.append(group)
        else:
            self.pending.pop(group, None)

    def lease(self, group: str, lease: Lease) -> None:
        """Record ``lease`` and when it runs out."""
        self.leased[group] = lease
        self.schedule(group, lease)

    def schedule(self, group: str, lease: Lease) -> None:
        """Note the lease's (new) deadline; older entries for it become stale."""
        heapq.heappush(self.expiries, (lease.deadline, lease.token, group))
        if len(self.expiries) > 2 * len(self.leased) + 64:  # mostly settled leases: compact
            self.expiries = [(v.deadline, v.token, g) for g, v in self.leased.items()]
            heapq.heapify(self.expiries)

    def current(self, handle: Handle) -> Lease | None:
        """The lease ``handle`` names, or ``None`` when it ran out or was settled since."""
        lease = self.leased.get(handle.group)
        return lease if lease is not None and lease.token == handle.token else None

    def soonest_expiry(self) -> float | None:
        """The earliest deadline of a live lease, dropping stale entries on the way."""
        while self.expiries:
            deadline, token, group = self.expiries[0]
            lease = self.leased.get(group)
            if lease is not None and lease.token == token and lease.deadline == deadline:
                return deadline
            heapq.heappop(self.expiries)
        return None

    def notify(self, everyone: bool = False) -> None:
        """Wake a blocked fetcher (every one with ``everyone``) and every event-loop waiter."""
        if everyone:
            self.cond.notify_all()
        else:
            self.cond.notify()
        waiters, self.waiters = self.waiters, []
        for loop, future in waiters:
            resolve_soon(loop, future)
