"""Replies in PostgreSQL, shared by every IO process; waiting requests are woken by NOTIFY.

Tables (schema ``db_schema``, created by ``agentkernel db migrate``): ``replies`` (one JSON
record per request id), ``tickets`` (the ticket of each accepted turn, first one wins),
``chunks`` (one row per chunk of a streamed reply), ``meta`` (the epoch and the deployment's
secret), and the quota tables (:mod:`agentkernel.pipeline.quota.postgres`). Every row carries
``expires_at``; reads ignore expired rows and a sweeper thread deletes them. Tickets and replies
also carry their ``session_key`` (:func:`~agentkernel.pipeline.wire.scoping.session_key`, from
migration 3 on), the per-session index an erase (:meth:`ResponseStore.forget_session`) follows.

Writing a reply or a chunk also sends ``NOTIFY`` on the channel ``ak:<db_schema>:replies``
with the request id, in the same statement. One ``LISTEN`` connection per store (on its own
thread) wakes the waiters of this process, so a ``rest_sync`` caller learns of its reply at once
without polling; each waiter still re-reads its row every ``RECHECK_SECONDS``, because a
notification sent while the listener was reconnecting is lost, the row is not.

A missing ticket is new only while the store's epoch is intact
(:mod:`agentkernel.pipeline.postgres.schema`); otherwise accepting or reading it raises
:class:`StoreDataLostError`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from psycopg import sql

from agentkernel.core.config.stores import PostgresStoreConfig
from agentkernel.core.errors import ResponseStoreError, StoreUnavailableError
from agentkernel.pipeline.postgres.backing import EPOCH, Backing
from agentkernel.pipeline.postgres.client import conninfo
from agentkernel.pipeline.quota import QuotaLedger
from agentkernel.pipeline.response_store.base import ResponseStore
from agentkernel.pipeline.response_store.waiters import WaiterRegistry, wait_for_record
from agentkernel.pipeline.wire.records import ResponseRecord, TurnTicket
from agentkernel.pipeline.wire.scoping import session_key

logger = logging.getLogger(__name__)

#: Longest time a waiter relies on notifications alone before it reads its row again, seconds.
RECHECK_SECONDS = 1.0
#: Seconds the listener blocks for notifications before it looks at its stop flag.
LISTEN_TICK = 0.5
#: NOTIFY payloads must stay under 8000 bytes; a longer request id is found by the re-read.
MAX_PAYLOAD = 7900

KEY = "execution.response_store.postgres"
_TTL = "now() + make_interval(secs => %(ttl)s)"
_NOTIFY = "pg_notify(%(channel)s, %(payload)s)"
_PUT = f"""
INSERT INTO {{s}}.replies (request_id, doc, expires_at, session_key)
VALUES (%(id)s, %(doc)s, {_TTL}, %(key)s)
ON CONFLICT (request_id) DO UPDATE SET
  doc = EXCLUDED.doc, expires_at = EXCLUDED.expires_at, session_key = EXCLUDED.session_key
RETURNING {_NOTIFY}"""
_GET = "SELECT doc FROM {s}.replies WHERE request_id = %s AND expires_at > now()"
# The first live ticket wins: an expired one is replaced, a live one kept (its token tells).
# Nothing is written, and no row returned, when the epoch is not this process's.
_ACCEPT = f"""
INSERT INTO {{s}}.tickets (request_id, doc, token, expires_at, session_key)
SELECT %(id)s, %(doc)s, %(token)s, {_TTL}, %(key)s WHERE {EPOCH} = %(epoch)s
ON CONFLICT (request_id) DO UPDATE SET
  doc = CASE WHEN tickets.expires_at <= now() THEN EXCLUDED.doc ELSE tickets.doc END,
  token = CASE WHEN tickets.expires_at <= now() THEN EXCLUDED.token ELSE tickets.token END,
  session_key = CASE WHEN tickets.expires_at <= now() THEN EXCLUDED.session_key
                     ELSE tickets.session_key END,
  expires_at = CASE WHEN tickets.expires_at <= now() THEN EXCLUDED.expires_at
                    ELSE tickets.expires_at END
RETURNING doc, token"""
_TICKET = f"""
SELECT (SELECT doc FROM {{s}}.tickets WHERE request_id = %s AND expires_at > now()), {EPOCH}"""
# The chunks of one OUTPUT message in one statement: frame k of %(frames)s is chunk first + k.
_PUT_CHUNKS = f"""
WITH kept AS (
  INSERT INTO {{s}}.chunks (request_id, idx, frame, expires_at)
  SELECT %(id)s, %(first)s + c.n - 1, c.frame, {_TTL}
  FROM unnest(%(frames)s::text[]) WITH ORDINALITY AS c(frame, n)
  ON CONFLICT DO NOTHING)
SELECT {_NOTIFY}"""
_CHUNKS = """
SELECT frame FROM {s}.chunks WHERE request_id = %s AND idx > %s AND expires_at > now()
ORDER BY idx"""
_CHANGED = """
SELECT EXISTS (SELECT 1 FROM {s}.chunks
               WHERE request_id = %(id)s AND idx > %(seen)s AND expires_at > now())
    OR EXISTS (SELECT 1 FROM {s}.replies WHERE request_id = %(id)s AND expires_at > now())"""
# A session's turns: every ticket and reply written with its key (migration 3 on), expired or not.
_SESSION_REQUESTS = """
SELECT request_id FROM {s}.tickets WHERE session_key = %(key)s
UNION SELECT request_id FROM {s}.replies WHERE session_key = %(key)s"""
_ERASE_TURN = """
WITH t AS (DELETE FROM {s}.tickets WHERE request_id = %(id)s RETURNING 1),
     r AS (DELETE FROM {s}.replies WHERE request_id = %(id)s RETURNING 1),
     c AS (DELETE FROM {s}.chunks WHERE request_id = %(id)s RETURNING 1)
SELECT (SELECT count(*) FROM t) + (SELECT count(*) FROM r) + (SELECT count(*) FROM c)"""
# The stored-bytes counts of erased turns: keys "<request_id>" and "<request_id>#<chunk>".
_FORGET_BYTES = """
DELETE FROM {s}.quota_bytes WHERE owner = %(owner)s
  AND (key = ANY(%(ids)s) OR substring(key FROM '^(.*)#[0-9]+$') = ANY(%(ids)s))"""
_SECRET = """
INSERT INTO {s}.meta (name, value) VALUES ('secret', %s) ON CONFLICT (name) DO NOTHING;
"""


class PostgresResponseStore(ResponseStore):
    """Response store in a PostgreSQL database.

    Args:
        config: the ``execution.response_store.postgres`` block.
        ttl: seconds a record stays readable.

    Raises:
        AKConfigError: the DSN is malformed, or the schema is missing or older and
            ``auto_provision`` is off.
    """

    shared = True
    keeps_tickets = True
    pushes = True
    erases_sessions = True

    def __init__(self, config: PostgresStoreConfig, ttl: float = 3600.0) -> None:
        super().__init__(ttl)
        self._db = Backing(
            config,
            KEY,
            unavailable=StoreUnavailableError,
            failed=ResponseStoreError,
            tables=("replies", "tickets", "chunks", "quota_unread", "quota_bytes"),
        )
        self._channel = f"ak:{config.db_schema}:replies"
        self._waiters = WaiterRegistry()
        self._listener: _Listener | None = None
        self._lock = threading.Lock()
        self._secret: bytes | None = None

    def _args(self, request_id: str, doc: str, **more: object) -> dict[str, object]:
        payload = request_id if len(request_id.encode()) <= MAX_PAYLOAD else ""
        base = {"id": request_id, "doc": doc, "ttl": self.ttl, "channel": self._channel}
        return base | {"payload": payload} | more

    def put(self, record: ResponseRecord) -> None:
        key = session_key(record.session_id, record.owner)
        args = self._args(record.request_id, record.to_json(), key=key)
        with self._db.connection(f"write of {record.request_id}") as conn:
            conn.execute(self._db.q(_PUT), args)

    def get(self, request_id: str) -> ResponseRecord | None:
        with self._db.connection(f"read of {request_id}") as conn:
            row = conn.execute(self._db.q(_GET), [request_id]).fetchone()
        return None if row is None else ResponseRecord.from_json(str(row[0]))

    def accept(self, ticket: TurnTicket) -> TurnTicket | None:
        what = f"the ticket of {ticket.request_id}"
        epoch, token = self._db.ensure(), uuid.uuid4().hex
        key = session_key(ticket.session_id, ticket.owner)
        args = self._args(ticket.request_id, ticket.to_json(), token=token, epoch=epoch, key=key)
        with self._db.connection(f"write of {what}") as conn:
            row = conn.execute(self._db.q(_ACCEPT), args).fetchone()
            found = None if row else conn.execute(self._db.q(f"SELECT {EPOCH}")).fetchone()
        if row is None:  # nothing written: the epoch is not this process's
            self._db.check_miss(None if found is None else found[0], what)
            raise ResponseStoreError(f"{what} was not kept; retry")  # the epoch came back
        return None if row[1] == token else TurnTicket.from_json(str(row[0]))

    def ticket(self, request_id: str) -> TurnTicket | None:
        self._db.ensure()
        with self._db.connection(f"read of the ticket of {request_id}") as conn:
            row = conn.execute(self._db.q(_TICKET), [request_id]).fetchone()
        doc, epoch = (None, None) if row is None else row
        if doc is None:
            self._db.check_miss(epoch, f"the ticket of {request_id}")
            return None
        return TurnTicket.from_json(str(doc))

    def put_chunk(self, request_id: str, index: int, frame: dict[str, Any]) -> None:
        self.put_chunks(request_id, index, [frame])

    def put_chunks(self, request_id: str, first: int, frames: list[dict[str, Any]]) -> None:
        docs = [json.dumps(frame) for frame in frames]
        args = self._args(request_id, "", first=first, frames=docs)
        with self._db.connection(f"write of chunks {first}+ of {request_id}") as conn:
            conn.execute(self._db.q(_PUT_CHUNKS), args)

    def chunks(self, request_id: str, after: int = -1) -> list[dict[str, Any]]:
        with self._db.connection(f"read of chunks of {request_id}") as conn:
            rows = conn.execute(self._db.q(_CHUNKS), [request_id, after]).fetchall()
        return [json.loads(str(row[0])) for row in rows]

    def _changed(self, request_id: str, seen: int) -> bool:
        with self._db.connection(f"read of {request_id}") as conn:
            row = conn.execute(self._db.q(_CHANGED), {"id": request_id, "seen": seen}).fetchone()
        return bool(row and row[0])

    async def wait(self, request_id: str, timeout: float) -> ResponseRecord | None:
        await self._wait_until(request_id, timeout, lambda: self.get(request_id) is not None)
        return await asyncio.to_thread(self.get, request_id)

    async def wait_change(self, request_id: str, timeout: float, seen: int) -> bool:
        return await self._wait_until(request_id, timeout, lambda: self._changed(request_id, seen))

    async def _wait_until(self, request_id: str, timeout: float, check: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            await asyncio.to_thread(self._ensure_listener)  # may connect: not on the loop
            remaining = deadline - time.monotonic()
            await wait_for_record(
                self._waiters, request_id, max(0.0, min(remaining, RECHECK_SECONDS)), check
            )
            if await asyncio.to_thread(check) or remaining <= RECHECK_SECONDS:
                return await asyncio.to_thread(check)

    def _ensure_listener(self) -> None:
        with self._lock:
            if self._listener is not None and self._listener.is_alive():
                return
            with self._db.errors("subscription to replies"):
                self._listener = _Listener(
                    conninfo(self._db.config, KEY), self._channel, self._waiters.notify
                )
            self._listener.start()

    def forget_session(
        self, session_id: str, owner: str | None, request_ids: Iterable[str] = ()
    ) -> list[str]:
        """Erase the session's turns (see the base class) and their stored-bytes counts, which
        live in this database and would otherwise hold erased replies against the owner."""
        erased = super().forget_session(session_id, owner, request_ids)
        if owner is not None and erased:
            with self._db.connection(f"quota release of session {session_id}") as conn:
                conn.execute(self._db.q(_FORGET_BYTES), {"owner": owner, "ids": erased})
        return erased

    def _session_requests(self, key: str) -> list[str]:
        with self._db.connection(f"read of the turns of session {key}") as conn:
            rows = conn.execute(self._db.q(_SESSION_REQUESTS), {"key": key}).fetchall()
        return [str(row[0]) for row in rows]

    def _erase_turn(self, request_id: str) -> bool:
        with self._db.connection(f"erase of {request_id}") as conn:
            row = conn.execute(self._db.q(_ERASE_TURN), {"id": request_id}).fetchone()
        return bool(row and int(str(row[0])) > 0)

    def _forget_requests(self, key: str) -> None:
        """Nothing to drop: the index is the ``session_key`` of the rows just erased."""

    def _new_quota_ledger(self) -> QuotaLedger:
        from agentkernel.pipeline.quota.postgres import PostgresQuotaLedger

        return PostgresQuotaLedger(self._db, self.ttl)

    def shared_secret(self) -> bytes:
        """Kept in the ``meta`` table without expiry; the first process to write it wins."""
        if self._secret is None:
            get = "SELECT value FROM {s}.meta WHERE name = 'secret'"
            with self._db.connection("read of the deployment secret") as conn:
                conn.execute(self._db.q(_SECRET), [secrets.token_hex(32)])
                row = conn.execute(self._db.q(get)).fetchone()
            if row is None:
                raise ResponseStoreError("the deployment secret vanished from PostgreSQL; retry")
            self._secret = str(row[0]).encode()
        return self._secret

    def sweep(self) -> int:
        """Delete expired rows now (the sweeper thread does it every ``sweep_interval``)."""
        return self._db.sweep()

    def ping(self) -> None:
        self._db.ping()

    def close(self) -> None:
        with self._lock:
            if self._listener is not None:
                self._listener.stop()
        self._db.close()


class _Listener(threading.Thread):
    """A ``LISTEN`` connection of its own, waking waiters with each notification's payload.

    It ends when the connection drops; the next wait starts a new one.

    Raises:
        psycopg.Error: the connection or the ``LISTEN`` failed (at construction).
    """

    def __init__(self, dsn: str, channel: str, wake: Callable[[str], None]) -> None:
        super().__init__(name="postgres-reply-listener", daemon=True)
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        self._wake = wake
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                for note in self._conn.notifies(timeout=LISTEN_TICK):
                    self._wake(note.payload)
        except psycopg.Error:  # the connection dropped: waiters re-read their rows meanwhile
            logger.debug("reply listener stopped", exc_info=True)
        finally:
            self._conn.close()

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(LISTEN_TICK * 4)
        else:
            self._conn.close()
