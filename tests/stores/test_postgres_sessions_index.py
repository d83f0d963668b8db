"""Listing and erasing sessions in PostgreSQL: the upgrade of a schema deployed at version 1
(rows written before the sessions API), the listing's order and cursor, hostile cursors."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from agentkernel.cli.commands import main
from agentkernel.core.errors import StaleSessionError
from agentkernel.pipeline.postgres.schema import LATEST, current_version, migrate
from agentkernel.pipeline.response_store.postgres import PostgresResponseStore
from agentkernel.pipeline.session_store.base import SessionRecord, TurnOutcome
from agentkernel.pipeline.session_store.index import SessionEntry
from agentkernel.pipeline.session_store.postgres import PostgresSessionStore
from agentkernel.pipeline.wire.records import ResponseRecord, TurnTicket
from agentkernel.pipeline.wire.scoping import owner_scope, session_key
from tests.stores.postgres_helpers import Schemas, schemas

__all__ = ["schemas"]
pytestmark = pytest.mark.postgres

OWNER = "key:alice"


def _sql(dsn: str, statement: str, *args: object) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(statement, list(args))  # type: ignore[call-overload]
        return list(cursor.fetchall()) if cursor.description else []


def _v1_rows(dsn: str, schema: str, key: str, request_id: str) -> None:
    """What a release at schema version 1 wrote for one turn of ``key`` (the v1 columns only)."""
    record = SessionRecord(state={"n": 1}, version=1, committed=(request_id,), owner=OWNER)
    ticket = TurnTicket(request_id, key.partition("/")[2], "fp", OWNER)
    reply = ResponseRecord(request_id, ticket.session_id, 200, {"result": "old"}, OWNER)
    rows = {
        "sessions": (key, 1, record.encode()),
        "tickets": (request_id, ticket.to_json(), "token"),
        "replies": (request_id, reply.to_json()),
        "chunks": (request_id, 0, "{}"),
        "quota_bytes": (OWNER, request_id, 10),
    }
    for table, values in rows.items():
        marks = ", ".join(["%s"] * len(values))
        live = "now() + interval '1 hour'"
        _sql(dsn, f'INSERT INTO "{schema}".{table} VALUES ({marks}, {live})', *values)


def test_a_schema_at_version_1_upgrades_and_its_old_sessions_list_once_touched(
    schemas: Schemas, capsys: pytest.CaptureFixture[str]
) -> None:
    config = schemas.config(auto_provision=False)
    name, scope = config.db_schema, owner_scope(OWNER)
    with psycopg.connect(schemas.dsn, autocommit=True) as conn:
        assert migrate(conn, name, upto=1) == [1]
    old, touched = f"{scope}/old", f"{scope}/touched"
    _v1_rows(schemas.dsn, name, old, "r-old")
    _v1_rows(schemas.dsn, name, touched, "r-touched")
    assert main(["db", "migrate", "--dsn", schemas.dsn, "--schema", name]) == 0
    assert f"at version {LATEST} (applied 2, 3, 4)" in capsys.readouterr().out
    sessions = PostgresSessionStore(config)
    try:
        base_old = sessions.read(old)  # a turn in flight across the erase
        assert base_old.state == {"n": 1}  # an old row reads as before
        assert sessions.list_sessions(scope, 10).entries == []  # not listed: no activity yet
        base = sessions.read(touched)
        sessions.commit(touched, base, TurnOutcome("r-new", 200, "{}"), {"n": 2})
        assert [e.key for e in sessions.list_sessions(scope, 10).entries] == [touched]
        sessions.delete(old)  # an old row erases like a new one, and fences its turns
        with pytest.raises(StaleSessionError):
            sessions.commit(old, base_old, TurnOutcome("r-late", 200, "{}"), None)
        assert sessions.read(old) == SessionRecord()
    finally:
        sessions.close()


def test_an_old_turn_is_erased_when_the_session_record_names_it(schemas: Schemas) -> None:
    config = schemas.config()
    name = config.db_schema
    with psycopg.connect(schemas.dsn, autocommit=True) as conn:
        migrate(conn, name, upto=1)
    key = session_key("old", OWNER)
    _v1_rows(schemas.dsn, name, key, "r-old")
    store = PostgresResponseStore(config)  # auto_provision: migrates to the latest
    try:
        assert store.forget_session("old", OWNER) == []  # no session_key: not indexed
        assert store.forget_session("old", "key:bob", ["r-old"]) == []  # not bob's
        assert store.forget_session("old", OWNER, ["r-old"]) == ["r-old"]
    finally:
        store.close()
    for table in ("tickets", "replies", "chunks", "quota_bytes"):
        assert _sql(schemas.dsn, f'SELECT * FROM "{name}".{table}') == [], table


def test_migrate_up_to_a_version_stops_there(schemas: Schemas) -> None:
    name = schemas.config().db_schema
    with psycopg.connect(schemas.dsn, autocommit=True) as conn:
        assert migrate(conn, name, upto=2) == [1, 2]
        assert current_version(conn, name) == 2
        assert migrate(conn, name) == list(range(3, LATEST + 1))


def _store(schemas: Schemas) -> PostgresSessionStore:
    return PostgresSessionStore(schemas.config())


def test_equal_times_page_by_key_in_code_point_order(schemas: Schemas) -> None:
    config, scope = schemas.config(), uuid.uuid4().hex
    store = PostgresSessionStore(config)
    names = ["a", "B", "é", "z", "~", "Ω", "a b", "😀", "A"]
    keys = [f"{scope}/{n}" for n in names]
    try:
        for key in keys:
            store.save(key, {})
        _sql(schemas.dsn, f'UPDATE "{config.db_schema}".sessions SET active_at = 1000')
        seen: list[str] = []
        after: SessionEntry | None = None
        for _ in range(len(keys) + 1):
            page = store.list_sessions(scope, 2, after)
            seen += [e.key for e in page.entries]
            if not page.more:
                break
            after = page.entries[-1]
    finally:
        store.close()
    assert seen == sorted(keys, reverse=True)  # the order page_of and every other store use


@pytest.mark.parametrize(
    "after",
    [
        SessionEntry("x", 10**30),  # past any bigint
        SessionEntry("'; DROP TABLE sessions; --", 2**63),
        SessionEntry("%s {s} é", -(10**30)),
    ],
)
def test_hostile_cursors_list_without_error(schemas: Schemas, after: SessionEntry) -> None:
    store, scope = _store(schemas), uuid.uuid4().hex
    try:
        store.save(f"{scope}/s", {})
        page = store.list_sessions(scope, 5, after)
        expected = [f"{scope}/s"] if after.active_at > 0 else []
        assert [e.key for e in page.entries] == expected and not page.more
        assert store.list_sessions("'; DROP TABLE sessions; --", 5).entries == []
        assert store.read(f"{scope}/s").version == 1
    finally:
        store.close()
