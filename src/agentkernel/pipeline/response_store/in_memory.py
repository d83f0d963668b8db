"""Replies in a dict of this process, with waiters woken the moment their reply lands."""

from __future__ import annotations

import heapq
import threading
import time
from typing import Any

from agentkernel.pipeline.response_store.base import ResponseRecord, ResponseStore, TurnTicket
from agentkernel.pipeline.response_store.waiters import WaiterRegistry, wait_for_record

# Expiry-heap key prefixes of chunk lists and tickets (request ids are printable).
_CHUNKS = "\x00chunks:"
_TICKET = "\x00ticket:"


class InMemoryResponseStore(ResponseStore):
    """A single-process response store (embedded topology).

    A waiting request registers a future; :meth:`put` resolves it on the waiter's event loop,
    so a sync request learns of its reply without polling. Expired records are dropped on write.
    """

    nonblocking = True
    keeps_tickets = True
    pushes = True

    def __init__(self, ttl: float = 3600.0) -> None:
        super().__init__(ttl)
        self._records: dict[str, tuple[float, ResponseRecord]] = {}
        self._chunks: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        self._tickets: dict[str, tuple[float, TurnTicket]] = {}
        self._expiry: list[tuple[float, str]] = []
        self._waiters = WaiterRegistry()
        self._lock = threading.Lock()

    def put(self, record: ResponseRecord) -> None:
        now = time.monotonic()
        with self._lock:
            self._evict(now)
            expires = now + self.ttl
            self._records[record.request_id] = (expires, record)
            heapq.heappush(self._expiry, (expires, record.request_id))
        self._waiters.notify(record.request_id)

    def get(self, request_id: str) -> ResponseRecord | None:
        with self._lock:
            entry = self._records.get(request_id)
        if entry is None or entry[0] <= time.monotonic():
            return None
        return entry[1]

    def accept(self, ticket: TurnTicket) -> TurnTicket | None:
        now = time.monotonic()
        with self._lock:
            self._evict(now)
            entry = self._tickets.get(ticket.request_id)
            if entry is not None:
                return entry[1]
            expires = now + self.ttl
            self._tickets[ticket.request_id] = (expires, ticket)
            heapq.heappush(self._expiry, (expires, _TICKET + ticket.request_id))
        return None

    def ticket(self, request_id: str) -> TurnTicket | None:
        with self._lock:
            entry = self._tickets.get(request_id)
        if entry is None or entry[0] <= time.monotonic():
            return None
        return entry[1]

    def put_chunk(self, request_id: str, index: int, frame: dict[str, Any]) -> None:
        now = time.monotonic()
        with self._lock:
            self._evict(now)
            entry = self._chunks.get(request_id)
            if entry is None:
                entry = self._chunks[request_id] = (now + self.ttl, [])
                heapq.heappush(self._expiry, (entry[0], _CHUNKS + request_id))
            if index != len(entry[1]):
                return  # already kept (or out of order, which per-session FIFO rules out)
            entry[1].append(frame)
        self._waiters.notify(request_id)

    def chunks(self, request_id: str, after: int = -1) -> list[dict[str, Any]]:
        with self._lock:
            entry = self._chunks.get(request_id)
            return [] if entry is None else entry[1][after + 1 :]

    async def wait_change(self, request_id: str, timeout: float, seen: int) -> bool:
        def changed() -> bool:
            return self._changed(request_id, seen)

        await wait_for_record(self._waiters, request_id, timeout, changed, inline=True)
        return changed()

    async def wait(self, request_id: str, timeout: float) -> ResponseRecord | None:
        await wait_for_record(
            self._waiters, request_id, timeout, lambda: self.get(request_id), inline=True
        )
        return self.get(request_id)

    def _evict(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            expires, key = heapq.heappop(self._expiry)
            table: dict[str, Any] = self._records
            if key.startswith(_CHUNKS):
                table, key = self._chunks, key.removeprefix(_CHUNKS)
            elif key.startswith(_TICKET):
                table, key = self._tickets, key.removeprefix(_TICKET)
            entry = table.get(key)
            if entry is not None and entry[0] == expires:
                del table[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)
