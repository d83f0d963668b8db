"""Replies in a dict of this process, with waiters woken the moment their reply lands."""

from __future__ import annotations

import heapq
import threading
import time

from agentkernel.pipeline.response_store.base import ResponseRecord, ResponseStore
from agentkernel.pipeline.response_store.waiters import WaiterRegistry, wait_for_record


class InMemoryResponseStore(ResponseStore):
    """A single-process response store (embedded topology).

    A waiting request registers a future; :meth:`put` resolves it on the waiter's event loop,
    so a sync request learns of its reply without polling. Expired records are dropped on write.
    """

    nonblocking = True

    def __init__(self, ttl: float = 3600.0) -> None:
        super().__init__(ttl)
        self._records: dict[str, tuple[float, ResponseRecord]] = {}
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

    async def wait(self, request_id: str, timeout: float) -> ResponseRecord | None:
        await wait_for_record(
            self._waiters, request_id, timeout, lambda: self.get(request_id), inline=True
        )
        return self.get(request_id)

    def _evict(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            expires, request_id = heapq.heappop(self._expiry)
            entry = self._records.get(request_id)
            if entry is not None and entry[0] == expires:
                del self._records[request_id]

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)
