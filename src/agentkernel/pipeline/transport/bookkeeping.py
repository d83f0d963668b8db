"""Delivery bookkeeping for brokers without per-message state (Kafka).

Kept per partition (``partition`` is ``group:topic:number``), for the records above the
partition's committed offset only:

- an attempt counter per record offset, so a count survives consumer restarts and a
  crash-looping poison record cannot reset it; it is dropped once a commit covers the record;
- the offsets already finished (acknowledged), so that after a crash or a rebalance the next
  owner of the partition skips them instead of running them again; dropped with the commit too;
- a dedup claim keyed by ``dedup_id``: the first record to claim it owns it for the window; a
  different record with the same id is a duplicate, the owner itself (a redelivery) is not.

Everything in Redis carries a TTL, so the keys of an abandoned group or topic go away. The
in-memory store forgets everything when the process exits; use the Redis store when receive
counts must be exact across restarts and a crash must not replay finished records.
"""

from __future__ import annotations

import functools
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

from agentkernel.core.errors import TransportError
from agentkernel.core.redis_errors import connect, redis_errors

ATTEMPTS_TTL_SECONDS = 86400.0
_errors = functools.partial(redis_errors, unavailable=TransportError, failed=TransportError)

# Count one more delivery unless the record is already finished (then answer 0), atomically.
_START_DELIVERY = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local count = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
redis.call('EXPIRE', KEYS[2], ARGV[2])
return count
"""


class BookkeepingStore(ABC):
    """Attempt counters, finished offsets and dedup claims; all methods are thread-safe.

    Raises:
        TransportError: the store is unreachable (Redis).
    """

    @abstractmethod
    def start_delivery(self, partition: str, offset: int) -> int:
        """Count one more delivery of a record; returns the new (1-based) count.

        Returns 0, counting nothing, when the record is already finished.
        """

    @abstractmethod
    def finish(self, partition: str, offset: int) -> None:
        """Remember that the record at ``offset`` is finished, until a commit covers it."""

    @abstractmethod
    def forget(self, partition: str, committed: int, offsets: Iterable[int]) -> None:
        """A commit at ``committed`` landed: drop the finished offsets below it and the
        attempt counters of ``offsets`` (records the commit covers)."""

    @abstractmethod
    def claim_dedup(self, dedup_id: str, owner: str, window: float) -> bool:
        """Claim ``dedup_id`` for ``window`` seconds; ``True`` when ``owner`` holds the claim."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the store's connections."""


class InMemoryBookkeepingStore(BookkeepingStore):
    """Process-local bookkeeping. Args: clock: time source in seconds (tests move it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._attempts: dict[tuple[str, int], int] = {}
        self._finished: dict[str, set[int]] = {}
        self._claims: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def start_delivery(self, partition: str, offset: int) -> int:
        with self._lock:
            if offset in self._finished.get(partition, ()):
                return 0
            count = self._attempts.get((partition, offset), 0) + 1
            self._attempts[partition, offset] = count
            return count

    def finish(self, partition: str, offset: int) -> None:
        with self._lock:
            self._finished.setdefault(partition, set()).add(offset)

    def forget(self, partition: str, committed: int, offsets: Iterable[int]) -> None:
        with self._lock:
            for offset in offsets:
                self._attempts.pop((partition, offset), None)
            done = self._finished.get(partition)
            if done:
                self._finished[partition] = {o for o in done if o >= committed}

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

    Per partition one hash of attempt counters and one sorted set of finished offsets, both
    expiring ``ttl`` seconds after their last write (keys share a hash tag, for Redis Cluster).

    Args:
        url: Redis URL.
        prefix: key prefix.
        ttl: seconds the keys of a partition live after their last write.
    """

    def __init__(self, url: str, prefix: str = "ak:", ttl: float = ATTEMPTS_TTL_SECONDS) -> None:
        self._redis = connect(url, "execution.queues.kafka.bookkeeping_redis_url")
        self._prefix = prefix
        self._ttl = int(ttl)
        self._start = self._redis.register_script(_START_DELIVERY)

    def _keys(self, partition: str) -> tuple[str, str]:
        base = f"{self._prefix}{{{partition}}}"
        return f"{base}:finished", f"{base}:attempts"

    def _run(self, what: str, call: Callable[[], Any]) -> Any:
        with _errors(f"{what} of the Kafka bookkeeping"):
            return call()

    def start_delivery(self, partition: str, offset: int) -> int:
        keys = list(self._keys(partition))
        count = self._run("start_delivery", lambda: self._start(keys, [offset, self._ttl]))
        return int(count)

    def finish(self, partition: str, offset: int) -> None:
        finished, _ = self._keys(partition)
        pipe = self._redis.pipeline()
        pipe.zadd(finished, {str(offset): offset})
        pipe.expire(finished, self._ttl)
        self._run("finish", pipe.execute)

    def forget(self, partition: str, committed: int, offsets: Iterable[int]) -> None:
        finished, attempts = self._keys(partition)
        fields = [str(o) for o in offsets]
        pipe = self._redis.pipeline()
        pipe.zremrangebyscore(finished, "-inf", f"({committed}")
        if fields:
            pipe.hdel(attempts, *fields)
        self._run("forget", pipe.execute)

    def claim_dedup(self, dedup_id: str, owner: str, window: float) -> bool:
        name = f"{self._prefix}dedup:{dedup_id}"

        def claim() -> bool:
            if self._redis.set(name, owner, nx=True, px=max(int(window * 1000), 1)):
                return True
            holder = self._redis.get(name)
            if isinstance(holder, bytes):
                holder = holder.decode()
            return holder is None or holder == owner

        return bool(self._run("claim_dedup", claim))

    def close(self) -> None:
        self._redis.close()
