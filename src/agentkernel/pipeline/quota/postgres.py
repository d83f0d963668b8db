"""The per-identity quota ledger in PostgreSQL, shared by every IO process using the PostgreSQL
response store.

Two tables beside the replies: ``quota_unread`` (one row per unread request id of an identity)
and ``quota_bytes`` (one row per stored reply or chunk with its size), each row with its
expiry. An admission runs in one transaction holding an advisory lock on the identity, so two
fronts admitting for one identity at once cannot both take its last place; expired rows are
ignored, and deleted by the response store's sweeper.
"""

from __future__ import annotations

from agentkernel.pipeline.postgres.backing import Backing
from agentkernel.pipeline.quota import Quota, QuotaLedger

__all__ = ["PostgresQuotaLedger"]

_TTL = "now() + make_interval(secs => %(ttl)s)"
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%(lock)s, 0))"
# Whether the id is counted, then per table: how many (or how large), and the seconds until the
# oldest live entry ends.
_HELD = """
SELECT EXISTS (SELECT 1 FROM {s}.quota_unread
               WHERE owner = %(owner)s AND request_id = %(id)s AND expires_at > now()),
       count(*), extract(epoch FROM min(expires_at) - now()),
       (SELECT coalesce(sum(size), 0) FROM {s}.quota_bytes
        WHERE owner = %(owner)s AND expires_at > now()),
       (SELECT extract(epoch FROM min(expires_at) - now()) FROM {s}.quota_bytes
        WHERE owner = %(owner)s AND expires_at > now())
FROM {s}.quota_unread WHERE owner = %(owner)s AND expires_at > now()"""
_COUNT = f"""
INSERT INTO {{s}}.quota_unread (owner, request_id, expires_at) VALUES (%(owner)s, %(id)s, {_TTL})
ON CONFLICT (owner, request_id) DO UPDATE SET expires_at = EXCLUDED.expires_at"""
_READ = "DELETE FROM {s}.quota_unread WHERE owner = %s AND request_id = %s"
_STORED = f"""
INSERT INTO {{s}}.quota_bytes (owner, key, size, expires_at)
VALUES (%(owner)s, %(key)s, %(size)s, {_TTL})
ON CONFLICT (owner, key) DO UPDATE SET size = EXCLUDED.size, expires_at = EXCLUDED.expires_at"""


class PostgresQuotaLedger(QuotaLedger):
    """Quota counts in the response store's database.

    Args:
        backing: the response store's pool and schema.
        ttl: the store's TTL, in seconds.
    """

    def __init__(self, backing: Backing, ttl: float) -> None:
        super().__init__(ttl)
        self._db = backing

    def admit(self, owner: str, request_id: str, quota: Quota) -> float | None:
        args = {"owner": owner, "id": request_id, "ttl": self.ttl}
        args["lock"] = f"{self._db.schema}:quota:{owner}"
        with self._db.connection(f"quota check of {request_id}") as conn, conn.transaction():
            conn.execute(_LOCK, args)
            row = conn.execute(self._db.q(_HELD), args).fetchone()
            wait = None if row is None else _refusal(row, quota)
            if wait is None:
                conn.execute(self._db.q(_COUNT), args)
        return wait

    def read(self, owner: str, request_id: str) -> None:
        with self._db.connection(f"quota release of {request_id}") as conn:
            conn.execute(self._db.q(_READ), [owner, request_id])

    def stored(self, owner: str, key: str, size: int) -> None:
        args = {"owner": owner, "key": key, "size": size, "ttl": self.ttl}
        with self._db.connection(f"quota count of {key}") as conn:
            conn.execute(self._db.q(_STORED), args)


def _refusal(row: tuple[object, ...], quota: Quota) -> float | None:
    """Seconds until a place frees up when a cap refuses a new id, else ``None``."""
    counted, unread, unread_wait, size, bytes_wait = row
    if counted:
        return None
    if quota.unread_turns is not None and int(str(unread)) >= quota.unread_turns:
        return max(0.001, float(str(unread_wait)))
    if quota.reply_bytes is not None and int(str(size)) >= quota.reply_bytes:
        return max(0.001, float(str(bytes_wait)))
    return None
