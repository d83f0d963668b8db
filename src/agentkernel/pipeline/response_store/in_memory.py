"""Replies in a dict of this process, with waiters woken the moment their reply lands."""

from __future__ import annotations

import functools
import heapq
import threading
import time
from collections import OrderedDict
from typing import Any

from agentkernel.pipeline.response_store.base import ResponseStore
from agentkernel.pipeline.response_store.waiters import WaiterRegistry, wait_for_record
from agentkernel.pipeline.response_store.watch import PushedWatch
from agentkernel.pipeline.wire.records import ResponseRecord, TurnTicket
from agentkernel.pipeline.wire.scoping import session_key

# Expiry-heap key prefixes of chunk lists, tickets and session indexes (ids are printable).
_CHUNKS = "\x00chunks:"
_TICKET = "\x00ticket:"
_SESSION = "\x00session:"


class InMemoryResponseStore(ResponseStore):
    """A single-process response store (embedded topology).

    A waiting request registers a future; :meth:`put` resolves it on the waiter's event loop,
    so a sync request learns of its reply without polling. Expired records are dropped on write.
    """

    nonblocking = True
    keeps_tickets = True
    pushes = True
    erases_sessions = True

    def __init__(self, ttl: float = 3600.0) -> None:
        super().__init__(ttl)
        self._records: dict[str, tuple[float, ResponseRecord]] = {}
        self._chunks: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        self._tickets: dict[str, tuple[float, TurnTicket]] = {}
        # session key -> (expiry, request id -> expiry of its entries, soonest first)
        self._sessions: dict[str, tuple[float, OrderedDict[str, float]]] = {}
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
            self._index(record.session_id, record.owner, record.request_id, expires)
        self._waiters.notify(record.request_id, record)  # a watch takes it as it is

    def _index(self, session_id: str, owner: str | None, request_id: str, expires: float) -> None:
        """Index ``request_id`` under its session, in place (a copy of the index per turn made a
        session's turns dearer the longer it ran), forgetting those whose entries expired (a
        session busy for longer than ``ttl`` keeps no more ids than its live entries)."""
        key = session_key(session_id, owner)
        entry = self._sessions.get(key)
        requests: OrderedDict[str, float] = OrderedDict() if entry is None else entry[1]
        requests[request_id] = expires
        requests.move_to_end(request_id)
        now = expires - self.ttl
        while requests and next(iter(requests.values())) <= now:
            requests.popitem(last=False)
        self._sessions[key] = (expires, requests)
        heapq.heappush(self._expiry, (expires, _SESSION + key))

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
            self._index(ticket.session_id, ticket.owner, ticket.request_id, expires)
        return None

    def ticket(self, request_id: str) -> TurnTicket | None:
        with self._lock:
            entry = self._tickets.get(request_id)
        if entry is None or entry[0] <= time.monotonic():
            return None
        return entry[1]

    def put_chunk(self, request_id: str, index: int, frame: dict[str, Any]) -> None:
        self.put_chunks(request_id, index, [frame])

    def put_chunks(self, request_id: str, first: int, frames: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        with self._lock:
            self._evict(now)
            entry = self._chunks.get(request_id)
            if entry is None:
                entry = self._chunks[request_id] = (now + self.ttl, [])
                heapq.heappush(self._expiry, (entry[0], _CHUNKS + request_id))
            kept = entry[1]
            # An index already kept is skipped (a redelivery); one past the end cannot come
            # (per-session FIFO), and would be dropped too.
            new = frames[len(kept) - first :] if first <= len(kept) < first + len(frames) else []
            kept.extend(new)
        if new:
            self._waiters.notify(request_id)

    def chunks(self, request_id: str, after: int = -1) -> list[dict[str, Any]]:
        with self._lock:
            entry = self._chunks.get(request_id)
            return [] if entry is None else entry[1][after + 1 :]

    async def wait_change(self, request_id: str, timeout: float, seen: int) -> bool:
        changed = functools.partial(self._changed, request_id, seen)
        await wait_for_record(self._waiters, request_id, timeout, changed, inline=True)
        return changed()

    async def wait(self, request_id: str, timeout: float) -> ResponseRecord | None:
        await wait_for_record(
            self._waiters, request_id, timeout, lambda: self.get(request_id), inline=True
        )
        return self.get(request_id)

    def watch(self, request_id: str) -> PushedWatch:
        """Woken with the record itself by :meth:`put`; reads first, inline (a dict lookup)."""

        async def read() -> ResponseRecord | None:
            return self.get(request_id)

        return PushedWatch(self, request_id, self._waiters, read, _carried)

    def _evict(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            expires, key = heapq.heappop(self._expiry)
            table: dict[str, Any] = self._records
            if key.startswith(_CHUNKS):
                table, key = self._chunks, key.removeprefix(_CHUNKS)
            elif key.startswith(_TICKET):
                table, key = self._tickets, key.removeprefix(_TICKET)
            elif key.startswith(_SESSION):
                table, key = self._sessions, key.removeprefix(_SESSION)
            entry = table.get(key)
            if entry is not None and entry[0] == expires:
                del table[key]

    def _session_requests(self, key: str) -> list[str]:
        with self._lock:
            entry = self._sessions.get(key)
            return [] if entry is None else list(entry[1])

    def _erase_turn(self, request_id: str) -> bool:
        with self._lock:
            found = [t.pop(request_id, None) for t in (self._records, self._tickets, self._chunks)]
        return any(entry is not None for entry in found)

    def _forget_requests(self, key: str) -> None:
        with self._lock:
            self._sessions.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)


def _carried(value: object) -> ResponseRecord | None:
    """The record :meth:`InMemoryResponseStore.put` woke a watch with (chunks carry none)."""
    return value if isinstance(value, ResponseRecord) else None
