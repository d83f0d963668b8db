"""Replies in Redis, shared by every IO process; waiting requests are woken by pub/sub.

A record is a JSON string at ``<prefix>resp:<request_id>`` with a millisecond expiry (upstream
agentkernel's records, the same JSON at ``<upstream_prefix><request_id>``, are read too when
``upstream_prefix`` is set, for a migration). Writing it
also publishes on ``<prefix>done:<request_id>``; one pattern subscription per store (on its own
thread) wakes the waiters of this process, so a sync request learns of its reply at once without
polling and without a connection per waiting request. The message is the record's JSON itself
when it is at most ``NOTIFY_PAYLOAD_BYTES`` long (``1`` otherwise): a watch
(:meth:`RedisResponseStore.watch`) then has its reply without reading the key.

Chunks of a streamed reply are a list at ``<prefix>chunks:<request_id>``; appending some (one
script call for all the chunks of an OUTPUT message) publishes on the same channel, so a
streaming client connected to any IO process sees them at once. The
ticket of an accepted turn is a JSON string at ``<prefix>ticket:<request_id>``. The request ids
of each session's tickets and replies are sets, so a session can be erased
(:meth:`ResponseStore.forget_session`): one per hour,
``<prefix>turns:<session key>#<period>``, expiring with its entries, so that a session busy for
days does not grow one set for ever (earlier versions kept one, ``<prefix>turns:<session key>``,
which is still read and erased). A ticket is kept
only while the store's epoch is intact (:mod:`agentkernel.core.redis_guard`): after Redis lost
its data a missing ticket may be a lost one (a retry of a turn answered before), so accepting or
reading it raises :class:`StoreDataLostError` instead.

Every redis-py exception is mapped by :mod:`agentkernel.core.redis_errors`: connection trouble
becomes :class:`StoreUnavailableError` (worth retrying), anything else :class:`ResponseStoreError`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from agentkernel.core.errors import (
    ResponseStoreError,
    StoreDataLostError,
    StoreFullError,
    StoreUnavailableError,
)
from agentkernel.core.redis_client import on_node, require_one_slot
from agentkernel.core.redis_errors import connect, redis_errors
from agentkernel.core.redis_guard import RedisGuard, start_guard
from agentkernel.pipeline.quota import QuotaLedger
from agentkernel.pipeline.response_store.base import ResponseStore
from agentkernel.pipeline.response_store.redis_scripts import ACCEPT, APPEND_CHUNKS, PUT
from agentkernel.pipeline.response_store.waiters import WaiterRegistry, wait_for_record
from agentkernel.pipeline.response_store.watch import PushedWatch, announced_record
from agentkernel.pipeline.wire.records import (
    ResponseRecord,
    TurnTicket,
    index_period,
    index_periods,
)
from agentkernel.pipeline.wire.scoping import session_key

logger = logging.getLogger(__name__)

_errors = functools.partial(
    redis_errors,
    unavailable=StoreUnavailableError,
    failed=ResponseStoreError,
    full=StoreFullError,
    unreadable=True,
)

#: Longest time a waiter relies on pub/sub alone before it reads its key again, in seconds.
RECHECK_SECONDS = 1.0
#: Largest record sent along with its notification, in bytes: every IO process subscribed
#: receives each one, so a large reply is announced with ``1`` and read by its waiter instead.
NOTIFY_PAYLOAD_BYTES = 16 * 1024


class RedisResponseStore(ResponseStore):
    """Response store on a Redis server.

    Args:
        url: Redis URL.
        prefix: prefix of every key and channel.
        ttl: seconds a record stays readable.
        allow_eviction: run on a server whose eviction policy may drop tickets and replies.
        upstream_prefix: also read replies upstream agentkernel wrote at
            ``<upstream_prefix><request_id>`` (a migration); ``None`` reads only ours.

    Raises:
        AKConfigError: the URL is malformed, or the server may evict and ``allow_eviction``
            is off.
    """

    shared = True
    keeps_tickets = True
    pushes = True
    erases_sessions = True

    def __init__(
        self,
        url: str,
        prefix: str = "ak:",
        ttl: float = 3600.0,
        *,
        allow_eviction: bool = False,
        upstream_prefix: str | None = None,
    ) -> None:
        super().__init__(ttl)
        self._upstream_prefix = upstream_prefix
        key = "execution.response_store.redis"
        self._redis = connect(url, f"{key}.url")
        others = [] if upstream_prefix is None else [upstream_prefix]
        require_one_slot(self._redis, key, prefix, *others)
        self._prefix = prefix
        self._waiters = WaiterRegistry()
        self._listener: threading.Thread | None = None
        self._pubsub: Any = None
        self._lock = threading.Lock()
        self._put = self._redis.register_script(PUT)
        self._append = self._redis.register_script(APPEND_CHUNKS)
        self._accept = self._redis.register_script(ACCEPT)
        self._guard = RedisGuard(self._redis, prefix, key, allow_eviction=allow_eviction)
        start_guard(self._guard, key)
        self._secret: bytes | None = None

    def _key(self, request_id: str) -> str:
        return f"{self._prefix}resp:{request_id}"

    def _chunks_key(self, request_id: str) -> str:
        return f"{self._prefix}chunks:{request_id}"

    def _ticket_key(self, request_id: str) -> str:
        return f"{self._prefix}ticket:{request_id}"

    def _turns_key(self, session_id: str, owner: str | None) -> str:
        key = session_key(session_id, owner)
        return f"{self._prefix}turns:{key}#{index_period()}"

    def _turns_keys(self, key: str) -> list[str]:
        """The sets that can name a live turn of the session, and the one of earlier versions."""
        turns = f"{self._prefix}turns:{key}"
        return [f"{turns}#{period}" for period in index_periods(self.ttl)] + [turns]

    def put(self, record: ResponseRecord) -> None:
        text, request_id = record.to_json(), record.request_id
        news = text if len(text) <= NOTIFY_PAYLOAD_BYTES else "1"  # characters <= bytes
        keys = [self._key(request_id), self._turns_key(record.session_id, record.owner)]
        keys.append(f"{self._prefix}done:{request_id}")
        with _errors(f"write of {request_id}"):
            self._put(keys=keys, args=[text, int(self.ttl * 1000), request_id, news])

    def get(self, request_id: str) -> ResponseRecord | None:
        with _errors(f"read of {request_id}"):
            return self._record(request_id, self._redis.mget(self._record_keys(request_id)))

    def _record_keys(self, request_id: str) -> list[str]:
        keys = [self._key(request_id)]
        if self._upstream_prefix is not None:  # same JSON fields, another key
            keys.append(f"{self._upstream_prefix}{request_id}")
        return keys

    def _record(self, request_id: str, values: list[Any]) -> ResponseRecord | None:
        raw = next((value for value in values if value is not None), None)
        if raw is None and self._guard.refuses_misses():  # the reply may have been evicted
            raise StoreDataLostError(f"no reply of {request_id}: keys were evicted")
        return None if raw is None else ResponseRecord.from_json(raw)

    def accept(self, ticket: TurnTicket) -> TurnTicket | None:
        guard = self._guard
        keys = [self._ticket_key(ticket.request_id), f"{self._prefix}epoch"]
        keys.append(self._turns_key(ticket.session_id, ticket.owner))
        with _errors(f"write of the ticket of {ticket.request_id}"):
            guard.ensure()
            refused = "1" if guard.refuses_misses() else "0"
            args: list[str | int] = [ticket.to_json(), int(self.ttl * 1000), guard.epoch or ""]
            args += [refused, ticket.request_id]
            kept = self._accept(keys=keys, args=args)
            if kept == 0:
                guard.check_miss(f"the ticket of {ticket.request_id}")  # raises, and logs
                raise StoreDataLostError(f"no ticket of {ticket.request_id}: {guard.lost}")
            return None if kept is None else TurnTicket.from_json(kept)

    def ticket(self, request_id: str) -> TurnTicket | None:
        with _errors(f"read of the ticket of {request_id}"):
            self._guard.ensure()
            raw = self._redis.get(self._ticket_key(request_id))
            if raw is None:
                self._guard.check_miss(f"the ticket of {request_id}")
            return None if raw is None else TurnTicket.from_json(raw)

    def put_chunk(self, request_id: str, index: int, frame: dict[str, Any]) -> None:
        self.put_chunks(request_id, index, [frame])

    def put_chunks(self, request_id: str, first: int, frames: list[dict[str, Any]]) -> None:
        keys = [self._chunks_key(request_id), f"{self._prefix}done:{request_id}"]
        args: list[str | int] = [first, int(self.ttl * 1000)]
        args += [json.dumps(frame) for frame in frames]
        with _errors(f"write of chunks of {request_id}"):
            self._append(keys=keys, args=args)

    def chunks(self, request_id: str, after: int = -1) -> list[dict[str, Any]]:
        with _errors(f"read of chunks of {request_id}"):
            raw = self._redis.lrange(self._chunks_key(request_id), after + 1, -1)
            return [json.loads(item) for item in raw]

    def read_stream(
        self, request_id: str, after: int = -1
    ) -> tuple[ResponseRecord | None, list[dict[str, Any]]]:
        """One round trip; the server runs the record's read before the chunks' (see base).
        On a cluster, on the node serving the store's slot (a cluster pipeline takes no MGET)."""

        def read(node: redis.Redis) -> list[Any]:
            with node.pipeline(False) as pipe:
                pipe.mget(self._record_keys(request_id))
                pipe.lrange(self._chunks_key(request_id), after + 1, -1)
                return list(pipe.execute())

        with _errors(f"read of {request_id}"):
            values, raw = on_node(self._redis, self._key(request_id), read)
            return self._record(request_id, values), [json.loads(item) for item in raw]

    async def wait_change(self, request_id: str, timeout: float, seen: int) -> bool:
        changed = functools.partial(self._changed, request_id, seen)
        # Only a new chunk or the record publishes on the channel: a wake-up is a change.
        return await self._wait_until(request_id, timeout, changed, wake_is_change=True)

    def _changed(self, request_id: str, seen: int) -> bool:
        with _errors(f"read of {request_id}"), self._redis.pipeline(False) as pipe:
            pipe.llen(self._chunks_key(request_id))
            pipe.exists(self._key(request_id))
            length, exists = pipe.execute()
        return int(length) > seen + 1 or bool(exists)

    def watch(self, request_id: str) -> PushedWatch:
        """Registered on open; a reply announced with its JSON costs no read. The key is read
        first only when the subscription was not up before the watch opened, and again after a
        bare wake-up or ``RECHECK_SECONDS`` without one (a notification lost while the
        subscription was down)."""
        return _RedisWatch(self, request_id)

    def _listening(self) -> bool:
        listener = self._listener
        return listener is not None and listener.is_alive()

    async def wait(self, request_id: str, timeout: float) -> ResponseRecord | None:
        await self._wait_until(request_id, timeout, lambda: self.get(request_id) is not None)
        return self.get(request_id)

    async def _wait_until(
        self,
        request_id: str,
        timeout: float,
        check: Callable[[], bool],
        *,
        wake_is_change: bool = False,
    ) -> bool:
        """Wait for a notification, re-checking every ``RECHECK_SECONDS``: a notification sent
        while the subscription was down (Redis restarted) is lost, the key is not.

        Args:
            wake_is_change: a notification answers ``True`` without reading ``check`` again.
        """
        deadline = time.monotonic() + timeout
        while True:
            if not self._listening():
                with _errors("subscription to replies"):
                    await asyncio.to_thread(self._ensure_listener)  # may connect: not on the loop
            remaining = deadline - time.monotonic()
            slice_ = max(0.0, min(remaining, RECHECK_SECONDS))
            if await wait_for_record(self._waiters, request_id, slice_, check) and wake_is_change:
                return True
            if (found := await asyncio.to_thread(check)) or remaining <= RECHECK_SECONDS:
                return found

    def _ensure_listener(self) -> None:
        with self._lock:
            if self._listening():
                return
            if self._pubsub is not None:
                self._pubsub.close()  # the previous listener's connection dropped
            # redis-py types pubsub() from 8.2 on; older releases leave it untyped.
            self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call, unused-ignore]
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
                self._waiters.notify(channel.removeprefix(done), item.get("data"))
        except (redis.RedisError, ValueError, AttributeError):
            # Closed by close(), or the connection dropped: the next wait starts a new listener,
            # and every waiter also re-checks the key, so nothing is lost meanwhile.
            logger.debug("reply listener stopped", exc_info=True)

    async def _read(self, request_id: str) -> ResponseRecord | None:
        return await asyncio.to_thread(self.get, request_id)

    def _new_quota_ledger(self) -> QuotaLedger:
        from agentkernel.pipeline.quota.redis import RedisQuotaLedger

        return RedisQuotaLedger(self._redis, self._prefix, self.ttl)

    def shared_secret(self) -> bytes:
        """Kept at ``<prefix>secret`` without expiry; the first process to write it wins."""
        if self._secret is None:
            key = f"{self._prefix}secret"
            with _errors("read of the deployment secret"):
                self._redis.set(key, secrets.token_hex(32), nx=True)
                raw = self._redis.get(key)
            if raw is None:  # evicted between the two calls: say so, never use a local one
                raise ResponseStoreError("the deployment secret vanished from Redis; retry")
            self._secret = raw if isinstance(raw, bytes) else str(raw).encode()
        return self._secret

    def _session_requests(self, key: str) -> list[str]:
        with _errors(f"read of the turns of session {key}"):
            members = self._redis.sunion(self._turns_keys(key))
        return [m.decode() if isinstance(m, bytes) else str(m) for m in members]

    def _erase_turn(self, request_id: str) -> bool:
        keys = self._record_keys(request_id)  # with a reply upstream wrote before a migration
        keys += [self._ticket_key(request_id), self._chunks_key(request_id)]
        with _errors(f"erase of {request_id}"):
            return int(self._redis.delete(*keys)) > 0

    def _forget_requests(self, key: str) -> None:
        with _errors(f"erase of the turns of session {key}"):
            self._redis.delete(*self._turns_keys(key))

    def ping(self) -> None:
        with _errors("ping"):
            self._guard.probe()

    def warnings(self) -> list[str]:
        return list(self._guard.warnings)

    def close(self) -> None:
        with _errors("close"), self._lock:
            if self._pubsub is not None:
                self._pubsub.close()
            self._redis.close()


class _RedisWatch(PushedWatch):
    """A watch that makes sure the store listens before it registers (see ``watch``)."""

    def __init__(self, store: RedisResponseStore, request_id: str) -> None:
        super().__init__(
            store,
            request_id,
            store._waiters,
            functools.partial(store._read, request_id),
            announced_record,
            recheck=RECHECK_SECONDS,
        )
        self._redis_store = store

    async def open(self) -> None:
        store = self._redis_store
        # A reply published before the subscription was up is missed: read the key first then.
        self.read_first = not store._listening()
        if self.read_first:
            try:  # may connect: not on the loop
                await asyncio.to_thread(store._ensure_listener)
            except (redis.RedisError, OSError):  # the reads that follow say what is wrong
                logger.debug("no subscription to replies yet", exc_info=True)
        await super().open()
