"""The stores' tables, created and upgraded by versioned migrations (``agentkernel db migrate``).

Every table lives in one PostgreSQL schema (``db_schema``, default ``agentkernel``). The
schema's ``schema_version`` table lists the migrations applied; :func:`migrate` applies the
missing ones in order, each in its own transaction under an advisory lock, so running it twice,
or from two processes at once, is harmless. A store checks the version when it starts
(:func:`establish`): a missing or older schema is created there only with ``auto_provision``
(development); otherwise start-up fails with one line naming the table and the command to run.

Migration 1 also writes the store's **epoch**, a random id in the ``meta`` table. PostgreSQL
does not drop rows on its own, as Redis may, but a deployment can still lose its data: the
schema dropped and migrated again, the DSN pointed at a new, empty database. Each process reads
the epoch when it starts and compares it whenever a record is missing; a changed or missing
epoch means the record may have been lost, so the store raises :class:`StoreDataLostError`
rather than start the session (or accept the retried turn) afresh.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable

import psycopg
from psycopg import sql

from agentkernel.core.errors import AKConfigError

logger = logging.getLogger(__name__)

_V1 = """
CREATE TABLE {s}.meta (name text PRIMARY KEY, value text NOT NULL);
CREATE TABLE {s}.replies (
    request_id text PRIMARY KEY, doc text NOT NULL, expires_at timestamptz NOT NULL);
CREATE INDEX replies_expiry ON {s}.replies (expires_at);
CREATE TABLE {s}.tickets (
    request_id text PRIMARY KEY, doc text NOT NULL, token text NOT NULL,
    expires_at timestamptz NOT NULL);
CREATE INDEX tickets_expiry ON {s}.tickets (expires_at);
CREATE TABLE {s}.chunks (
    request_id text NOT NULL, idx integer NOT NULL, frame text NOT NULL,
    expires_at timestamptz NOT NULL, PRIMARY KEY (request_id, idx));
CREATE INDEX chunks_expiry ON {s}.chunks (expires_at);
CREATE TABLE {s}.sessions (
    session_id text PRIMARY KEY, version bigint NOT NULL, doc text NOT NULL,
    expires_at timestamptz NOT NULL);
CREATE INDEX sessions_expiry ON {s}.sessions (expires_at);
CREATE TABLE {s}.quota_unread (
    owner text NOT NULL, request_id text NOT NULL, expires_at timestamptz NOT NULL,
    PRIMARY KEY (owner, request_id));
CREATE INDEX quota_unread_expiry ON {s}.quota_unread (expires_at);
CREATE TABLE {s}.quota_bytes (
    owner text NOT NULL, key text NOT NULL, size bigint NOT NULL,
    expires_at timestamptz NOT NULL, PRIMARY KEY (owner, key));
CREATE INDEX quota_bytes_expiry ON {s}.quota_bytes (expires_at);
INSERT INTO {s}.meta (name, value) VALUES ('epoch', {epoch});
"""

_V2 = """
CREATE TABLE {s}.queue_messages (
    id bigserial PRIMARY KEY, queue text NOT NULL, group_id text, body text NOT NULL,
    attributes text NOT NULL, receive_count integer NOT NULL DEFAULT 0,
    visible_at timestamptz NOT NULL DEFAULT now(), lease_token text,
    enqueued_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX queue_messages_heads ON {s}.queue_messages (queue, group_id, id);
ALTER TABLE {s}.queue_messages SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 1000);
CREATE TABLE {s}.queue_dedup (
    queue text NOT NULL, dedup_id text NOT NULL, expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue, dedup_id));
CREATE INDEX queue_dedup_expiry ON {s}.queue_dedup (expires_at);
CREATE TABLE {s}.queue_dead (
    id bigint PRIMARY KEY, queue text NOT NULL, group_id text, body text NOT NULL,
    attributes text NOT NULL, receive_count integer NOT NULL,
    enqueued_at timestamptz NOT NULL, dead_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX queue_dead_age ON {s}.queue_dead (dead_at);
"""

# Nullable columns without a default, so adding them rewrites no row; the indexes are partial, so
# they start empty. Rows written before have NULLs and join the indexes on their next write (no
# backfill: the erase finds their turns through the ids the session record names). Session ids
# sort by code point ("C"), the order of the listing's opaque cursor.
_V3 = """
ALTER TABLE {s}.sessions ADD COLUMN owner_scope text, ADD COLUMN active_at bigint;
CREATE INDEX sessions_by_owner ON {s}.sessions (owner_scope, active_at, session_id COLLATE "C")
    WHERE owner_scope IS NOT NULL;
ALTER TABLE {s}.tickets ADD COLUMN session_key text;
CREATE INDEX tickets_by_session ON {s}.tickets (session_key) WHERE session_key IS NOT NULL;
ALTER TABLE {s}.replies ADD COLUMN session_key text;
CREATE INDEX replies_by_session ON {s}.replies (session_key) WHERE session_key IS NOT NULL;
"""

# Turn control: the open turns of each session (one row, a jsonb map of request id to when it
# was opened) and the start mark or stop of each turn (pipeline.turn_control.signals_postgres).
# New tables only: nothing existing is rewritten or locked.
_V4 = """
CREATE TABLE {s}.open_turns (
    session_key text PRIMARY KEY, turns jsonb NOT NULL, expires_at timestamptz NOT NULL);
CREATE INDEX open_turns_expiry ON {s}.open_turns (expires_at);
CREATE TABLE {s}.turn_signals (
    request_id text PRIMARY KEY, started_in text, stop text, stop_until timestamptz,
    expires_at timestamptz NOT NULL);
CREATE INDEX turn_signals_expiry ON {s}.turn_signals (expires_at);
"""

#: The migrations in order: (version, what it does, SQL with ``{s}`` for the schema).
MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (1, "response store, session store and quota tables, and the store epoch", _V1),
    (2, "queue transport: messages, dedup ids and dead letters", _V2),
    (3, "sessions API: each identity's sessions by activity, each session's turns", _V3),
    (4, "turn control: each session's open turns, each turn's start and stop", _V4),
)
#: The schema version this release needs.
LATEST = MIGRATIONS[-1][0]
#: Tables whose rows expire, swept by :class:`~agentkernel.pipeline.postgres.sweeper.Sweeper`.
EXPIRING = (
    "replies",
    "tickets",
    "chunks",
    "sessions",
    "quota_unread",
    "quota_bytes",
    "open_turns",
    "turn_signals",
)


def command(schema: str) -> str:
    """The command an operator runs to create or upgrade the tables of ``schema``."""
    return (
        "'agentkernel db migrate --config config.yaml' "
        f"(or 'agentkernel db migrate --dsn URL --schema {schema}')"
    )


def current_version(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> int | None:
    """The latest migration applied to ``schema``, or ``None`` when it has no version table."""
    found = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", [f'"{schema}".schema_version']
    ).fetchone()
    if not found or not found[0]:
        return None
    query = sql.SQL("SELECT coalesce(max(version), 0) FROM {}.schema_version")
    row = conn.execute(query.format(sql.Identifier(schema))).fetchone()
    return int(str(row[0])) if row else 0


def migrate(
    conn: psycopg.Connection[tuple[object, ...]], schema: str, upto: int = LATEST
) -> list[int]:
    """Apply the migrations ``schema`` lacks, in order, up to version ``upto`` (an older one
    rebuilds what an earlier release deployed); returns the versions applied.

    Each migration and its ``schema_version`` row commit together, under a transaction-scoped
    advisory lock on the schema's name, so concurrent runs apply each migration once.
    """
    ident = sql.Identifier(schema)
    applied: list[int] = []
    for version, description, text in MIGRATIONS:
        if version > upto:
            break
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [schema])
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {}.schema_version (version integer PRIMARY KEY,"
                    " description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
                ).format(ident)
            )
            if (current_version(conn, schema) or 0) >= version:
                continue
            epoch = sql.Literal(uuid.uuid4().hex)
            conn.execute(sql.SQL(text).format(s=ident, epoch=epoch))
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.schema_version (version, description) VALUES (%s, %s)"
                ).format(ident),
                [version, description],
            )
        logger.info("schema %s: applied migration %s (%s)", schema, version, description)
        applied.append(version)
    return applied


def establish(
    conn: psycopg.Connection[tuple[object, ...]], schema: str, key: str, auto_provision: bool
) -> str:
    """Check that ``schema`` is at :data:`LATEST` (migrating it with ``auto_provision``) and
    return the store's epoch.

    Raises:
        AKConfigError: the schema is missing or older and ``auto_provision`` is off (one line
            naming the table and the command), or its epoch row is gone.
    """
    version = current_version(conn, schema)
    if version is None or version < LATEST:
        if not auto_provision:
            raise AKConfigError(_outdated(schema, version, key))
        migrate(conn, schema)
    return read_epoch(conn, schema, key)


def read_epoch(conn: psycopg.Connection[tuple[object, ...]], schema: str, key: str) -> str:
    """The epoch in ``schema``'s ``meta`` table.

    Raises:
        AKConfigError: the row is missing (the table was emptied by hand).
    """
    query = sql.SQL("SELECT value FROM {}.meta WHERE name = 'epoch'").format(sql.Identifier(schema))
    row = conn.execute(query).fetchone()
    if row is None:
        raise AKConfigError(
            f"{key}: table {schema}.meta has no epoch row: the schema was emptied by hand; "
            "drop the schema and run 'agentkernel db migrate'"
        )
    return str(row[0])


def _outdated(schema: str, version: int | None, key: str) -> str:
    if version is None:
        found = f"table {schema}.schema_version is missing"
    else:
        found = f"schema {schema} is at version {version}, this release needs {LATEST}"
    return (
        f"{key}: {found}: run {command(schema)} first, or set {key}.auto_provision: true "
        "in development"
    )


Query = Callable[[str], bytes]


def query_in(schema: str) -> Query:
    """A function composing SQL text whose tables are written ``{s}.name`` in ``schema``.

    Each text is composed once and kept as bytes: composing it again on every call, and
    psycopg turning the composed query into bytes on every execute, cost about a tenth of a
    short statement's round trip (measured in benchmarks/README.md).
    """
    ident = sql.Identifier(schema)

    @functools.lru_cache(maxsize=256)
    def compose(text: str) -> bytes:
        return sql.SQL(text).format(s=ident).as_bytes()

    return compose
