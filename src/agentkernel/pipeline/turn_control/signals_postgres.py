"""Turn signals in PostgreSQL, in the session store's schema (migration 4).

Two tables::

    open_turns    one row per session with open turns: session_key, turns (jsonb: request id
                  -> microseconds since the epoch when it was opened, by the server's clock),
                  expires_at (stale_after seconds after the latest open or start)
    turn_signals  one row per started or stopped turn: request_id, started_in (the session key
                  of a started turn), stop (JSON) and stop_until, expires_at

Every step is one statement. ``open`` is an upsert of the session's row: PostgreSQL locks the
row it conflicts on and evaluates the update against its latest version, so the stale entries
are dropped, the others read and the turn added (or, ``exclusive``, not) as one atomic step,
also against the first open of a session racing others. ``stop`` and ``start`` are upserts of
the turn's row guarded by the same conditions (no stop holds yet; a ``SUPERSEDE`` finds no
start), so they have exactly one winner; ``start`` opens the turn in the same statement.
``stops`` is one ``= ANY`` query; ``close`` deletes the turn's row and its entry (the session's
row too once empty). Expired rows are ignored by every statement and deleted by the store's
sweeper.

psycopg errors are mapped by the session store's :class:`Backing`: connection trouble is
:class:`SessionStoreUnavailableError`, anything else :class:`SessionStoreError`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from agentkernel.core.errors import SessionStoreError
from agentkernel.pipeline.postgres.backing import Backing
from agentkernel.pipeline.turn_control.signals import (
    STALE_AFTER_SECONDS,
    Stop,
    StopKind,
    TurnSignals,
)

__all__ = ["PostgresTurnSignals"]

#: Attempts of a stop or start whose answer changed between its write and its read-back.
_ATTEMPTS = 5

_NOW_US = "floor(extract(epoch FROM now()) * 1000000)::bigint"
_STALE_AT = "now() + make_interval(secs => %(stale)s)"
_TTL_AT = "now() + make_interval(secs => %(ttl)s)"
_EMPTY = "'{{}}'::jsonb"  # '{}' once the schema is formatted in
_ENTRY = f"jsonb_build_object(%(rid)s::text, {_NOW_US})"
# The live entries of the conflicting row t, as live.l (stale ones dropped).
_LIVE = f"""(SELECT coalesce(jsonb_object_agg(e.key, e.value), {_EMPTY}) AS l
    FROM jsonb_each(t.turns) AS e WHERE (e.value)::bigint > {_NOW_US} - %(stale_us)s) AS live"""

_OPEN = f"""
INSERT INTO {{s}}.open_turns AS t (session_key, turns, expires_at)
VALUES (%(key)s, {_ENTRY}, {_STALE_AT})
ON CONFLICT (session_key) DO UPDATE SET (turns, expires_at) = (
  SELECT CASE WHEN %(exclusive)s AND live.l - %(rid)s::text <> {_EMPTY} THEN live.l
         ELSE {_ENTRY} || live.l END,
         EXCLUDED.expires_at
  FROM {_LIVE})
RETURNING turns"""
# Marks the turn started unless a stop holds, and opens it in the same statement; counts 1 when
# it did. A live entry keeps its time (the right side of || wins).
_START = f"""
WITH flag AS (
  INSERT INTO {{s}}.turn_signals AS f (request_id, started_in, expires_at)
  VALUES (%(rid)s, %(key)s, {_STALE_AT})
  ON CONFLICT (request_id) DO UPDATE SET started_in = EXCLUDED.started_in,
    expires_at = greatest(f.expires_at, EXCLUDED.expires_at)
  WHERE f.stop_until IS NULL OR f.stop_until <= now()
  RETURNING 1
), opened AS (
  INSERT INTO {{s}}.open_turns AS t (session_key, turns, expires_at)
  SELECT %(key)s, {_ENTRY}, {_STALE_AT} FROM flag
  ON CONFLICT (session_key) DO UPDATE SET (turns, expires_at) = (
    SELECT {_ENTRY} || live.l, EXCLUDED.expires_at FROM {_LIVE})
)
SELECT count(*) FROM flag"""
# Returns a row when the stop was written: no stop held, and a SUPERSEDE found no start here.
_STOP = f"""
INSERT INTO {{s}}.turn_signals AS f (request_id, stop, stop_until, expires_at)
VALUES (%(rid)s, %(stop)s, {_TTL_AT}, {_TTL_AT})
ON CONFLICT (request_id) DO UPDATE SET stop = EXCLUDED.stop, stop_until = EXCLUDED.stop_until,
  expires_at = greatest(f.expires_at, EXCLUDED.expires_at)
WHERE (f.stop_until IS NULL OR f.stop_until <= now())
  AND NOT (%(supersede)s AND f.expires_at > now()
           AND f.started_in IS NOT DISTINCT FROM %(key)s::text)
RETURNING 1"""
_HELD = "SELECT stop FROM {s}.turn_signals WHERE request_id = %s AND stop_until > now()"
_STOPS = (
    "SELECT request_id, stop FROM {s}.turn_signals WHERE request_id = ANY(%s) "
    "AND stop_until > now()"
)
_CLOSE = """
WITH flag AS (DELETE FROM {s}.turn_signals WHERE request_id = %(rid)s),
gone AS (
  DELETE FROM {s}.open_turns WHERE session_key = %(key)s AND turns - %(rid)s::text = '{{}}'::jsonb
  RETURNING 1)
UPDATE {s}.open_turns SET turns = turns - %(rid)s::text
WHERE session_key = %(key)s AND turns ? %(rid)s::text AND NOT EXISTS (SELECT 1 FROM gone)"""
_FORGET = """
WITH gone AS (DELETE FROM {s}.open_turns WHERE session_key = %s RETURNING turns)
DELETE FROM {s}.turn_signals WHERE request_id IN (SELECT jsonb_object_keys(turns) FROM gone)"""


class PostgresTurnSignals(TurnSignals):
    """Turn signals in the schema of a :class:`PostgresSessionStore` (layout in the module
    docstring).

    Args:
        db: the session store's :class:`Backing` (pool, schema, error mapping).
        ttl: seconds a stop request is kept.
        stale_after: seconds an open turn that was never closed keeps counting as open.
    """

    def __init__(
        self, db: Backing, ttl: float = 86400.0, stale_after: float = STALE_AFTER_SECONDS
    ) -> None:
        super().__init__(ttl, stale_after)
        self._db = db
        self._times = {
            "stale": stale_after,
            "stale_us": max(1, int(stale_after * 1_000_000)),
            "ttl": ttl,
        }

    def _run(self, what: str, query: str, args: Any) -> list[tuple[Any, ...]]:
        """Run ``query`` (``{s}`` for the schema) and return its rows."""
        self._db.ensure()
        with self._db.connection(what) as conn:
            cursor = conn.execute(self._db.q(query), args)
            return cursor.fetchall() if cursor.description is not None else []

    def open(self, key: str, request_id: str, *, exclusive: bool = False) -> list[str]:
        args = {"key": key, "rid": request_id, "exclusive": exclusive, **self._times}
        rows = self._run(f"open of turn {request_id}", _OPEN, args)
        turns: dict[str, int] = rows[0][0] if rows else {}
        others = sorted((at, rid) for rid, at in turns.items() if rid != request_id)
        return [rid for _, rid in others]

    def stop(self, key: str, request_id: str, stop: Stop) -> Stop | None:
        supersede = stop.kind is StopKind.SUPERSEDE
        args = {"key": key, "rid": request_id, "stop": stop.encode(), "supersede": supersede}
        for _ in range(_ATTEMPTS):
            if self._run(f"stop of turn {request_id}", _STOP, args | self._times):
                return stop
            # Refused: a stop holds, or (SUPERSEDE) the turn has started.
            held = self._held(request_id)
            if held is not None or supersede:
                return held
        raise SessionStoreError(f"stop of turn {request_id}: its stop kept changing")

    def start(self, key: str, request_id: str) -> Stop | None:
        args = {"key": key, "rid": request_id, **self._times}
        for _ in range(_ATTEMPTS):
            if self._run(f"start of turn {request_id}", _START, args)[0][0]:
                return None
            if (held := self._held(request_id)) is not None:
                return held
        raise SessionStoreError(f"start of turn {request_id}: its stop kept changing")

    def _held(self, request_id: str) -> Stop | None:
        """The stop that holds for the turn now, if any."""
        rows = self._run(f"read of the stop of turn {request_id}", _HELD, [request_id])
        return Stop.decode(str(rows[0][0])) if rows else None

    def stops(self, request_ids: Collection[str]) -> dict[str, Stop]:
        ids = list(dict.fromkeys(request_ids))
        if not ids:
            return {}
        rows = self._run(f"read of the stops of {len(ids)} turns", _STOPS, [ids])
        return {str(rid): Stop.decode(str(stop)) for rid, stop in rows}

    def close(self, key: str, request_id: str) -> None:
        self._run(f"close of turn {request_id}", _CLOSE, {"key": key, "rid": request_id})

    def forget_session(self, key: str) -> None:
        self._run(f"erase of the open turns of session {key}", _FORGET, [key])

    def ping(self) -> None:
        self._db.ping()
