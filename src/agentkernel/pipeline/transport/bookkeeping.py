"""Delivery bookkeeping for brokers without per-message state (Kafka).

Two records per message, both with a TTL:

- an attempt counter keyed by the record's position (``group:topic:partition:offset``), so the
  count survives consumer restarts and a crash-looping poison record cannot reset it;
- a dedup claim keyed by ``dedup_id``: the first record to claim it owns it for the window; a
  different record with the same id is a duplicate, the owner itself (a redelivery) is not.

The in-memory store forgets everything when the process exits; use the Redis store when
receive counts must be exact across restarts.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

ATTEMPTS_TTL_SECONDS = 86400.0


class BookkeepingStore(ABC):
    """Attempt counters and dedup claims; all methods are thread-safe."""

    @abstractmethod
    def incr_attempts(self, key: str) -> int:
        """Count one more delivery of ``key``; returns the new (1-based) count."""

    @abstractmethod
    def clear_attempts(self, key: str) -> None:
        """Forget the count of ``key`` (it was acknowledged)."""

    @abstractmethod
    def claim_dedup(self, dedup_id: str, owner: str, window: float) -> bool:
        """Claim ``dedup_id`` for ``window`` seconds; ``True`` when ``owner`` holds the claim."""


class InMemoryBookkeepingStore(BookkeepingStore):
    """Process-local bookkeeping. Args: clock: time source in seconds (tests move it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._attempts: dict[str, int] = {}
        self._claims: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def incr_attempts(self, key: str) -> int:
        with self._lock:
            self._attempts[key] = self._attempts.get(key, 0) + 1
            return self._attempts[key]

    def clear_attempts(self, key: str) -> None:
        with self._lock:
            self._attempts.pop(key, None)

    def claim_dedup(self, dedup_id: str, owner: str, window: float) -> bool:
        now = self._clock()
        with self._lock:
            holder = self._claims.get(dedup_id)
            if holder is not None and holder[1] > now:
                return holder[0] == owner
            if len(self._claims) > 4096:
                self._claims = {k: v for k, v in self._claims.items() if v[1] > now}
            self._claims[dedup_id] = (owner, now + window)
            return True


class RedisBookkeepingStore(BookkeepingStore):
    """Bookkeeping in Redis, shared by every consumer and surviving restarts.

    Args:
        url: Redis URL.
        prefix: key prefix.
    """

    def __init__(self, url: str, prefix: str = "ak:") -> None:
        import redis

        self._redis = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._prefix = prefix

    def incr_attempts(self, key: str) -> int:
        name = f"{self._prefix}attempts:{key}"
        pipe = self._redis.pipeline()
        pipe.incr(name)
        pipe.expire(name, int(ATTEMPTS_TTL_SECONDS))
        count, _ = pipe.execute()
        return int(count)

    def clear_attempts(self, key: str) -> None:
        self._redis.delete(f"{self._prefix}attempts:{key}")

    def claim_dedup(self, dedup_id: str, owner: str, window: float) -> bool:
        name = f"{self._prefix}dedup:{dedup_id}"
        if self._redis.set(name, owner, nx=True, px=max(int(window * 1000), 1)):
            return True
        holder = self._redis.get(name)
        if isinstance(holder, bytes):
            holder = holder.decode()
        return holder is None or holder == owner
