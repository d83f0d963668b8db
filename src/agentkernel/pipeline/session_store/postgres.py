"""Session records in PostgreSQL: one row per session in ``sessions`` (version and JSON doc).

A commit is one conditional statement, atomic against every other runner process: the first
commit of a session inserts its row (or replaces an expired one), a later one updates the row
only while it is at the version the turn read. A session without a live row is new only while
the store's epoch is intact (:mod:`agentkernel.pipeline.postgres.schema`); otherwise the read
raises :class:`StoreDataLostError` rather than start the session again from nothing. Expired
rows are ignored by reads and deleted by the store's sweeper thread.

The commit also sets the row's ``owner_scope`` (:func:`~.index.scope_of`) and ``active_at`` (the
server's clock, milliseconds since the epoch, one clock for every runner), so the partial index
``sessions_by_owner`` (migration 3) lists an identity's sessions newest first, paged by a keyset
on ``(active_at, session_id)``. Erasing a session deletes its row: a turn that read the row
before then finds none at its version, and its commit is refused. A row written before
migration 3 has no scope: it reads, shows and erases as before, and is listed from its next
commit on (as a Redis or DynamoDB session written before the index existed).

psycopg errors are mapped by :mod:`agentkernel.pipeline.postgres.client`: connection trouble
and timeouts become :class:`SessionStoreUnavailableError` (worth retrying), anything else
:class:`SessionStoreError`.
"""

from __future__ import annotations

from agentkernel.core.config.stores import PostgresStoreConfig
from agentkernel.core.errors import (
    SessionStoreError,
    SessionStoreUnavailableError,
    StaleSessionError,
)
from agentkernel.pipeline.postgres.backing import EPOCH, Backing
from agentkernel.pipeline.session_store.base import SessionRecord, SessionStore
from agentkernel.pipeline.session_store.index import SessionEntry, SessionPage, page_of, scope_of
from agentkernel.pipeline.turn_control.signals import TurnSignals
from agentkernel.pipeline.turn_control.signals_postgres import PostgresTurnSignals

KEY = "session.postgres"
_TTL = "now() + make_interval(secs => %(ttl)s)"
_NOW_MS = "floor(extract(epoch FROM now()) * 1000)::bigint"
_READ = f"""
SELECT s.version, s.doc, {EPOCH}
FROM (SELECT 1) AS one
LEFT JOIN {{s}}.sessions AS s ON s.session_id = %s AND s.expires_at > now()"""
# Version 0: the session has no live row; an expired one is replaced.
_CREATE = f"""
INSERT INTO {{s}}.sessions (session_id, version, doc, expires_at, owner_scope, active_at)
VALUES (%(id)s, %(version)s, %(doc)s, {_TTL}, %(scope)s, {_NOW_MS})
ON CONFLICT (session_id) DO UPDATE SET
  version = EXCLUDED.version, doc = EXCLUDED.doc, expires_at = EXCLUDED.expires_at,
  owner_scope = EXCLUDED.owner_scope, active_at = EXCLUDED.active_at
WHERE sessions.expires_at <= now()"""
_UPDATE = f"""
UPDATE {{s}}.sessions SET version = %(version)s, doc = %(doc)s, expires_at = {_TTL},
  owner_scope = %(scope)s, active_at = {_NOW_MS}
WHERE session_id = %(id)s AND version = %(expected)s AND expires_at > now()"""
# Newest first, then by key in code point order (as page_of), strictly after the cursor; the
# condition names the index's columns and collation so the index serves it.
_LIST = """
SELECT session_id, active_at FROM {s}.sessions
WHERE owner_scope = %(scope)s AND expires_at > now()
  AND (active_at, session_id COLLATE "C") < (%(at)s, %(key)s COLLATE "C")
ORDER BY active_at DESC, session_id COLLATE "C" DESC
LIMIT %(limit)s"""
_DELETE = "DELETE FROM {s}.sessions WHERE session_id = %s"
# After every time: the first page's cursor (the key is then never compared).
_TOP = 2**62


class PostgresSessionStore(SessionStore):
    """Session records in a PostgreSQL database (at schema version 4: the listing needs 3, the
    turn signals 4).

    Args:
        config: the ``session.postgres`` block.
        ttl: seconds a session lives after a write.

    Raises:
        AKConfigError: the DSN is malformed, or the schema is missing or older and
            ``auto_provision`` is off.
    """

    lists_sessions = True

    def __init__(self, config: PostgresStoreConfig, ttl: float = 604800.0) -> None:
        self._ttl = ttl
        self._db = Backing(
            config,
            KEY,
            unavailable=SessionStoreUnavailableError,
            failed=SessionStoreError,
            tables=("sessions", "open_turns", "turn_signals"),
        )

    def read(self, session_id: str) -> SessionRecord:
        self._db.ensure()
        with self._db.connection(f"read of session {session_id}") as conn:
            row = conn.execute(self._db.q(_READ), [session_id]).fetchone()
        version, doc, epoch = (None, None, None) if row is None else row
        if doc is None:
            self._db.check_miss(epoch, f"session {session_id}")
            return SessionRecord()
        return SessionRecord.decode(str(doc), int(str(version)))

    def write(self, session_id: str, record: SessionRecord, *, expected_version: int) -> None:
        args = {"id": session_id, "version": record.version, "doc": record.encode()}
        args |= {"expected": expected_version, "ttl": self._ttl}
        args["scope"] = scope_of(session_id, record.owner)
        query = _CREATE if expected_version == 0 else _UPDATE
        with self._db.connection(f"write of session {session_id}") as conn:
            written = conn.execute(self._db.q(query), args).rowcount
        if written != 1:
            raise StaleSessionError(
                f"session {session_id} is no longer at version {expected_version}"
            )

    def list_sessions(
        self, scope: str, limit: int, after: SessionEntry | None = None
    ) -> SessionPage:
        at, key = (_TOP, "") if after is None else (after.active_at, after.key)
        # Kept a bigint: a larger number is sent as numeric and the index no longer serves the
        # keyset; page_of still compares every entry with the cursor's own time.
        at = max(-1, min(at, _TOP))
        args = {"scope": scope, "at": at, "key": key, "limit": limit + 1}
        with self._db.connection(f"listing of the sessions of {scope}") as conn:
            rows = conn.execute(self._db.q(_LIST), args).fetchall()
        entries = [SessionEntry(str(row[0]), int(str(row[1]))) for row in rows]
        return page_of(entries, limit, after)

    def delete(self, session_id: str) -> None:
        with self._db.connection(f"erase of session {session_id}") as conn:
            conn.execute(self._db.q(_DELETE), [session_id])

    def _new_turn_signals(self, stale_after: float) -> TurnSignals:
        return PostgresTurnSignals(self._db, stale_after=stale_after)

    def sweep(self) -> int:
        """Delete expired sessions and turn signals now (the sweeper thread does it every
        ``sweep_interval``)."""
        return self._db.sweep()

    def ping(self) -> None:
        self._db.ping()

    def close(self) -> None:
        """Stop the sweeper and close the connections."""
        self._db.close()
