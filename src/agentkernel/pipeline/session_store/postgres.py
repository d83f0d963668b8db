"""Session records in PostgreSQL: one row per session in ``sessions`` (version and JSON doc).

A commit is one conditional statement, atomic against every other runner process: the first
commit of a session inserts its row (or replaces an expired one), a later one updates the row
only while it is at the version the turn read. A session without a live row is new only while
the store's epoch is intact (:mod:`agentkernel.pipeline.postgres.schema`); otherwise the read
raises :class:`StoreDataLostError` rather than start the session again from nothing. Expired
rows are ignored by reads and deleted by the store's sweeper thread.

psycopg errors are mapped by :mod:`agentkernel.pipeline.postgres.client`: connection trouble
and timeouts become :class:`SessionStoreUnavailableError` (worth retrying), anything else
:class:`SessionStoreError`.
"""

from __future__ import annotations

from agentkernel.core.config_backends import PostgresStoreConfig
from agentkernel.core.errors import (
    SessionStoreError,
    SessionStoreUnavailableError,
    StaleSessionError,
)
from agentkernel.pipeline.postgres.backing import EPOCH, Backing
from agentkernel.pipeline.session_store.base import SessionRecord, SessionStore

KEY = "session.postgres"
_TTL = "now() + make_interval(secs => %(ttl)s)"
_READ = f"""
SELECT s.version, s.doc, {EPOCH}
FROM (SELECT 1) AS one
LEFT JOIN {{s}}.sessions AS s ON s.session_id = %s AND s.expires_at > now()"""
# Version 0: the session has no live row; an expired one is replaced.
_CREATE = f"""
INSERT INTO {{s}}.sessions (session_id, version, doc, expires_at)
VALUES (%(id)s, %(version)s, %(doc)s, {_TTL})
ON CONFLICT (session_id) DO UPDATE SET
  version = EXCLUDED.version, doc = EXCLUDED.doc, expires_at = EXCLUDED.expires_at
WHERE sessions.expires_at <= now()"""
_UPDATE = f"""
UPDATE {{s}}.sessions SET version = %(version)s, doc = %(doc)s, expires_at = {_TTL}
WHERE session_id = %(id)s AND version = %(expected)s AND expires_at > now()"""


class PostgresSessionStore(SessionStore):
    """Session records in a PostgreSQL database.

    Args:
        config: the ``session.postgres`` block.
        ttl: seconds a session lives after a write.

    Raises:
        AKConfigError: the DSN is malformed, or the schema is missing or older and
            ``auto_provision`` is off.
    """

    def __init__(self, config: PostgresStoreConfig, ttl: float = 604800.0) -> None:
        self._ttl = ttl
        self._db = Backing(
            config,
            KEY,
            unavailable=SessionStoreUnavailableError,
            failed=SessionStoreError,
            tables=("sessions",),
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
        query = _CREATE if expected_version == 0 else _UPDATE
        with self._db.connection(f"write of session {session_id}") as conn:
            written = conn.execute(self._db.q(query), args).rowcount
        if written != 1:
            raise StaleSessionError(
                f"session {session_id} is no longer at version {expected_version}"
            )

    def sweep(self) -> int:
        """Delete expired sessions now (the sweeper thread does it every ``sweep_interval``)."""
        return self._db.sweep()

    def ping(self) -> None:
        self._db.ping()

    def close(self) -> None:
        """Stop the sweeper and close the connections."""
        self._db.close()
