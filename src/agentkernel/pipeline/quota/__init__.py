"""Per-identity caps on what a caller leaves the service holding (``api.limits``).

Two things an identity can pile up cost the service for a whole TTL: turns it had accepted but
never read the reply of (each one queued, run, its reply stored), and the bytes of stored
replies and stream chunks. A :class:`QuotaLedger` counts both per identity; the chat front asks
it before a turn is admitted and answers 429 with ``Retry-After`` past a cap, before anything is
queued. A turn counts as unread from its admission until a front hands its reply to the caller
(a sync answer, a GET, a WebSocket reply, a finished stream); every entry also ends with the
response store's TTL, like the reply it stands for.

The ledger lives beside the replies: :meth:`ResponseStore.quota_ledger
<agentkernel.pipeline.response_store.base.ResponseStore.quota_ledger>` gives an in-process
ledger by default, a Redis one for the Redis store and a DynamoDB one for the DynamoDB store, so
the fronts sharing that store (IO processes, Lambda containers) share the counts. Identities
are opaque strings; a turn without one (authentication off) is not counted. Counting is best
effort: a ledger that cannot be reached lets the turn through (the
store's outage shows where replies are read) and says so in the log.
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

__all__ = ["InMemoryQuotaLedger", "Quota", "QuotaLedger", "retry_after"]

#: Longest ``Retry-After`` a refused caller is told, in seconds.
MAX_RETRY_AFTER = 60


@dataclass(frozen=True)
class Quota:
    """The caps one identity is held to; ``None`` switches a cap off."""

    unread_turns: int | None
    reply_bytes: int | None

    @property
    def off(self) -> bool:
        return self.unread_turns is None and self.reply_bytes is None


def retry_after(seconds: float) -> int:
    """A whole ``Retry-After`` between 1 and :data:`MAX_RETRY_AFTER` seconds."""
    return max(1, min(MAX_RETRY_AFTER, math.ceil(seconds)))


class QuotaLedger(ABC):
    """What each identity holds; thread-safe, blocking calls.

    Args:
        ttl: seconds an entry is counted at most (the response store's TTL).
    """

    #: Largest ``identity_unread_turns`` the ledger can hold (``None``: no bound).
    max_unread_turns: ClassVar[int | None] = None

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl

    @abstractmethod
    def admit(self, owner: str, request_id: str, quota: Quota) -> float | None:
        """Count ``request_id`` as unread for ``owner`` unless a cap is reached.

        Returns:
            ``None`` when admitted (a request id already counted is admitted again), else the
            seconds until the oldest entry holding the cap ends.
        """

    @abstractmethod
    def read(self, owner: str, request_id: str) -> None:
        """The reply of ``request_id`` reached its caller: it no longer counts as unread (an id
        not counted, or no longer, is ignored)."""

    @abstractmethod
    def stored(self, owner: str, key: str, size: int) -> None:
        """``size`` bytes were stored for ``owner`` under ``key`` (a request id, or a request id
        and chunk index); storing the same key again replaces its size."""


class InMemoryQuotaLedger(QuotaLedger):
    """The counts of one process (the in-memory store's, or a fallback)."""

    def __init__(self, ttl: float) -> None:
        super().__init__(ttl)
        self._lock = threading.Lock()
        self._unread: dict[str, dict[str, float]] = {}
        self._bytes: dict[str, dict[str, tuple[float, int]]] = {}

    def admit(self, owner: str, request_id: str, quota: Quota) -> float | None:
        now = time.monotonic()
        with self._lock:
            unread = _live(self._unread.setdefault(owner, {}), now)
            held = self._live_bytes(owner, now)
            if request_id not in unread:
                if quota.unread_turns is not None and len(unread) >= quota.unread_turns:
                    return min(unread.values()) - now
                total = sum(size for _, size in held.values())
                if quota.reply_bytes is not None and total >= quota.reply_bytes:
                    return min(expiry for expiry, _ in held.values()) - now
            unread[request_id] = now + self.ttl
            return None

    def read(self, owner: str, request_id: str) -> None:
        with self._lock:
            self._unread.get(owner, {}).pop(request_id, None)

    def stored(self, owner: str, key: str, size: int) -> None:
        with self._lock:
            self._bytes.setdefault(owner, {})[key] = (time.monotonic() + self.ttl, size)

    def _live_bytes(self, owner: str, now: float) -> dict[str, tuple[float, int]]:
        held = self._bytes.setdefault(owner, {})
        for key in [k for k, (expiry, _) in held.items() if expiry <= now]:
            del held[key]
        return held


def _live(entries: dict[str, float], now: float) -> dict[str, float]:
    for key in [k for k, expiry in entries.items() if expiry <= now]:
        del entries[key]
    return entries
