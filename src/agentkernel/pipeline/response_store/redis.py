"""Replies in Redis, shared by every IO process; waiting requests are woken by pub/sub.

A record is a JSON string at ``<prefix>resp:<request_id>`` with a millisecond expiry. Writing it
also publishes on ``<prefix>done:<request_id>``; one pattern subscription per store (on its own
thread) wakes the waiters of this process, so a sync request learns of its reply at once without
polling and without a connection per waiting request.

Every redis-py exception is mapped in :func:`_redis_errors`: connection trouble becomes
:class:`StoreUnavailableError` (worth retrying), anything else :class:`ResponseStoreError`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from agentkernel.core.errors import AKConfigError, ResponseStoreError, StoreUnavailableError
from agentkernel.pipeline.response_store.base import ResponseRecord, ResponseStore
from agentkernel.pipeline.response_store.waiters import WaiterRegistry, wait_for_record

logger = logging.getLogger(__name__)


class RedisResponseStore(ResponseStore):
    """Response store on a Redis server.

    Args:
        url: Redis URL.
        prefix: prefix of every key and channel.
        ttl: seconds a record stays readable.
    """

    shared = True

    def __init__(self, url: str, prefix: str = "ak:", ttl: float = 3600.0) -> None:
        super().__init__(ttl)
        try:
            self._redis = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        except ValueError as exc:  # the message names the scheme, never the password
            raise AKConfigError(f"execution.response_store.redis.url: {exc}") from exc
        self._prefix = prefix
        self._waiters = WaiterRegistry()
        self._listener: threading.Thread | None = None
        self._pubsub: Any = None
        self._lock = threading.Lock()

    def _key(self, request_id: str) -> str:
        return f"{self._prefix}resp:{request_id}"

    def put(self, record: ResponseRecord) -> None:
        with _redis_errors(f"write of {record.request_id}"):
            pipe = self._redis.pipeline()
            pipe.set(self._key(record.request_id), record.to_json(), px=int(self.ttl * 1000))
            pipe.publish(f"{self._prefix}done:{record.request_id}", b"1")
            pipe.execute()

    def get(self, request_id: str) -> ResponseRecord | None:
        with _redis_errors(f"read of {request_id}"):
            raw = self._redis.get(self._key(request_id))
            return None if raw is None else ResponseRecord.from_json(raw)

    async def wait(self, request_id: str, timeout: float) -> ResponseRecord | None:
        with _redis_errors("subscription to replies"):
            await asyncio.to_thread(self._ensure_listener)  # may connect: not on the loop
        await wait_for_record(self._waiters, request_id, timeout, lambda: self.get(request_id))
        return self.get(request_id)

    def _ensure_listener(self) -> None:
        with self._lock:
            if self._listener is not None and self._listener.is_alive():
                return
            if self._pubsub is not None:
                self._pubsub.close()  # the previous listener's connection dropped
            self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            self._pubsub.psubscribe(f"{self._prefix}done:*")
            self._listener = threading.Thread(
                target=self._listen, args=(self._pubsub,), name="redis-reply-listener", daemon=True
            )
            self._listener.start()

    def _listen(self, pubsub: Any) -> None:
        done = f"{self._prefix}done:"
        try:
            for item in pubsub.listen():
                channel = item.get("channel", b"").decode()
                self._waiters.notify(channel.removeprefix(done))
        except (redis.RedisError, ValueError, AttributeError):
            # Closed by close(), or the connection dropped: the next wait starts a new listener,
            # and every waiter also re-checks the key, so nothing is lost meanwhile.
            logger.debug("reply listener stopped", exc_info=True)

    def ping(self) -> None:
        with _redis_errors("ping"):
            self._redis.ping()

    def close(self) -> None:
        with _redis_errors("close"), self._lock:
            if self._pubsub is not None:
                self._pubsub.close()
            self._redis.close()


@contextmanager
def _redis_errors(operation: str) -> Iterator[None]:
    """Map redis-py exceptions (and undecodable records) to the store's errors."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise StoreUnavailableError(f"Redis {operation} failed: {exc}") from exc
    except redis.RedisError as exc:
        raise ResponseStoreError(f"Redis {operation} failed: {exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise ResponseStoreError(f"Redis {operation}: unreadable record: {exc!r}") from exc
