"""What an operator meets with the PostgreSQL stores: migrations, a refused start, an outage,
lost data, the sweeper, and hostile input."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from agentkernel.cli.commands import main
from agentkernel.core.config.stores import PostgresStoreConfig, ResponseStoreConfig, SessionConfig
from agentkernel.core.errors import (
    AKConfigError,
    SessionStoreError,
    StoreDataLostError,
    StoreUnavailableError,
)
from agentkernel.pipeline.postgres.schema import LATEST, current_version, migrate
from agentkernel.pipeline.response_store import create_response_store
from agentkernel.pipeline.response_store.postgres import PostgresResponseStore
from agentkernel.pipeline.session_store import create_session_store
from agentkernel.pipeline.session_store.base import SessionRecord
from agentkernel.pipeline.session_store.postgres import PostgresSessionStore
from agentkernel.pipeline.wire.records import ResponseRecord, TurnTicket
from tests import servers
from tests.stores.postgres_helpers import Proxy, Schemas, schemas

__all__ = ["schemas"]
pytestmark = pytest.mark.postgres


def _migrate(dsn: str, schema: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return migrate(conn, schema)


def _version(dsn: str, schema: str) -> int | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return current_version(conn, schema)


# -- migrations and start-up ----------------------------------------------------------------


def test_migrate_is_versioned_and_idempotent(schemas: Schemas) -> None:
    name = schemas.config().db_schema
    assert _version(schemas.dsn, name) is None
    assert _migrate(schemas.dsn, name) == list(range(1, LATEST + 1))
    assert _migrate(schemas.dsn, name) == []
    assert _version(schemas.dsn, name) == LATEST


def test_concurrent_migrations_apply_each_version_once(schemas: Schemas) -> None:
    name = schemas.config().db_schema
    results: list[list[int]] = []
    threads = [
        threading.Thread(target=lambda: results.append(_migrate(schemas.dsn, name)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    # Each migration takes the lock alone, so one run may apply 1 and another 2 and 3: the
    # promise is that every version is applied once, by one of them.
    applied = sorted(version for run in results for version in run)
    assert len(results) == 4 and applied == list(range(1, LATEST + 1))


def test_production_refuses_a_missing_schema_in_one_line(schemas: Schemas) -> None:
    config = schemas.config(auto_provision=False)
    with pytest.raises(AKConfigError) as caught:
        PostgresSessionStore(config)
    text = str(caught.value)
    assert "\n" not in text
    assert f"table {config.db_schema}.schema_version is missing" in text
    assert "agentkernel db migrate" in text and "session.postgres.auto_provision" in text
    assert _version(schemas.dsn, config.db_schema) is None  # nothing created


def test_production_refuses_an_older_schema(schemas: Schemas) -> None:
    config = schemas.config(auto_provision=False)
    name = config.db_schema
    schemas.execute(f'CREATE SCHEMA "{name}"')
    schemas.execute(
        f'CREATE TABLE "{name}".schema_version (version integer PRIMARY KEY, '
        "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
    )
    with pytest.raises(AKConfigError, match=rf"at version 0, this release needs {LATEST}"):
        PostgresResponseStore(config)


def test_a_migrated_schema_starts_without_auto_provision(schemas: Schemas) -> None:
    config = schemas.config(auto_provision=False)
    _migrate(schemas.dsn, config.db_schema)
    store = PostgresSessionStore(config)
    try:
        assert store.read("s") == SessionRecord()
    finally:
        store.close()


def test_the_cli_migrates_a_dsn_and_the_stores_of_a_config(
    schemas: Schemas, tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second, third = (schemas.config().db_schema for _ in range(3))
    assert main(["db", "migrate", "--dsn", schemas.dsn, "--schema", first]) == 0
    assert main(["db", "migrate", "--dsn", schemas.dsn, "--schema", first]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"--dsn: schema {first} at version {LATEST} (applied 1, 2, 3, 4)",
        f"--dsn: schema {first} at version {LATEST} (nothing to apply)",
    ]
    path = f"{tmp_path}/config.yaml"
    with open(path, "w") as file:
        file.write(
            "execution:\n  queues:\n    type: postgres\n"
            f"    postgres: {{dsn: '{schemas.dsn}', db_schema: {third}}}\n"
            "  response_store:\n    type: postgres\n"
            f"    postgres: {{dsn: '{schemas.dsn}', db_schema: {second}}}\n"
            "session:\n  type: postgres\n"
            f"  postgres: {{dsn: '{schemas.dsn}', db_schema: {second}}}\n"
        )
    assert main(["db", "migrate", "--config", path]) == 0
    done = f"at version {LATEST} (applied {', '.join(map(str, range(1, LATEST + 1)))})"
    assert capsys.readouterr().out.splitlines() == [
        f"execution.queues.postgres: schema {third} {done}",
        f"execution.response_store.postgres: schema {second} {done}",
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["--dsn", "postgresql://127.0.0.1/x", "--schema", "x; DROP SCHEMA public"],
        ["--dsn", "postgresql://127.0.0.1/x", "--schema", 'Quoted"'],
        ["--dsn", "host=h password=hunter2 broken"],
        ["--schema", "agentkernel", "--config", "/nonexistent.yaml"],
        ["--config", "/nonexistent.yaml"],
    ],
)
def test_the_cli_refuses_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "migrate", *argv]) == 2
    assert "hunter2" not in capsys.readouterr().err


def test_the_cli_fails_with_status_1_on_an_unreachable_server(
    capsys: pytest.CaptureFixture[str],
) -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{servers.free_port()}/test"
    assert main(["db", "migrate", "--dsn", dsn]) == 1
    assert "PostgreSQL unavailable" in capsys.readouterr().err


# -- the factories and the config ----------------------------------------------------------


def test_the_factories_build_postgres_stores(schemas: Schemas) -> None:
    block = schemas.config().model_dump()
    store = create_response_store(
        ResponseStoreConfig.model_validate({"type": "postgres", "postgres": block, "ttl": 5})
    )
    sessions = create_session_store(
        SessionConfig.model_validate({"type": "postgres", "postgres": block})
    )
    try:
        assert isinstance(store, PostgresResponseStore) and store.ttl == 5
        assert isinstance(sessions, PostgresSessionStore)
    finally:
        store.close()
        sessions.close()  # type: ignore[attr-defined]


def test_the_factories_require_the_block() -> None:
    with pytest.raises(AKConfigError, match=r"response_store\.postgres: block is required"):
        create_response_store(ResponseStoreConfig(type="postgres"))
    with pytest.raises(AKConfigError, match=r"session\.postgres: block is required"):
        create_session_store(SessionConfig(type="postgres"))


@pytest.mark.parametrize(
    "settings",
    [
        {"db_schema": "Upper"},
        {"db_schema": "a-b"},
        {"db_schema": ""},
        {"db_schema": "x" * 64},
        {"db_schema": 'x"; DROP TABLE y; --'},
        {"pool_size": 0},
        {"connect_timeout": 0},
        {"statement_timeout": -1},
        {"sweep_interval": 0},
        {"unknown": 1},
    ],
)
def test_hostile_settings_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        PostgresStoreConfig.model_validate(settings)


def test_a_malformed_dsn_is_refused_without_echoing_it() -> None:
    config = PostgresStoreConfig(dsn="host=h password=hunter2 broken")
    with pytest.raises(AKConfigError, match=r"execution\.response_store\.postgres\.dsn") as caught:
        PostgresResponseStore(config)
    assert "hunter2" not in str(caught.value)


# -- outages and lost data ----------------------------------------------------------------


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts TCP connections and never says a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield int(listener.getsockname()[1])
    listener.close()


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_a_dead_server_fails_calls_in_seconds(kind: str, silent_server: int) -> None:
    port = servers.free_port() if kind == "refused" else silent_server
    config = PostgresStoreConfig(
        dsn=f"postgresql://postgres@127.0.0.1:{port}/test", connect_timeout=1.0
    )
    started = time.monotonic()
    store = PostgresResponseStore(config)  # starts: the check waits for the server
    sessions = PostgresSessionStore(config)
    try:
        for call in (lambda: store.get("r"), store.ping, lambda: sessions.read("s")):
            with pytest.raises(StoreUnavailableError):
                call()
        with pytest.raises(StoreUnavailableError):
            asyncio.run(store.wait("r", 5))
    finally:
        store.close()
        sessions.close()
    assert time.monotonic() - started < 25


def test_a_re_created_schema_is_lost_data_not_new_records(schemas: Schemas) -> None:
    config = schemas.config()
    store, sessions = PostgresResponseStore(config), PostgresSessionStore(config)
    try:
        store.accept(TurnTicket("r1", "s", "digest"))
        sessions.save("s", {"n": 1})
        schemas.execute(f'DROP SCHEMA "{config.db_schema}" CASCADE')
        with pytest.raises(StoreDataLostError, match="tables are gone"):
            sessions.read("s")
        _migrate(schemas.dsn, config.db_schema)  # empty again, with a new epoch
        with pytest.raises(StoreDataLostError, match="epoch"):
            sessions.read("s")
        with pytest.raises(StoreDataLostError, match="epoch"):
            store.ticket("r1")
        with pytest.raises(StoreDataLostError, match="epoch"):
            store.accept(TurnTicket("r1", "s", "digest"))
        with pytest.raises(StoreDataLostError):
            store.ping()
    finally:
        store.close()
        sessions.close()
    restarted = PostgresSessionStore(config)  # a restart accepts the loss
    try:
        assert restarted.read("s") == SessionRecord()
    finally:
        restarted.close()


# -- the sweeper -------------------------------------------------------------------------


def _count(schemas: Schemas, schema: str, table: str) -> int:
    with psycopg.connect(schemas.dsn, autocommit=True) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{schema}".{table}').fetchone()  # type: ignore[call-overload]
    return int(row[0])


def test_the_sweeper_deletes_expired_rows(schemas: Schemas) -> None:
    config = schemas.config(sweep_interval=0.2)
    store = PostgresResponseStore(config, ttl=0.3)
    sessions = PostgresSessionStore(config, ttl=0.3)
    try:
        for i in range(5):
            store.put(ResponseRecord(f"r{i}", "s", 200, {}))
            store.put_chunk(f"r{i}", 0, {"i": i})
            store.accept(TurnTicket(f"r{i}", "s", "d"))
            sessions.save(f"s{i}", {"i": i})
        deadline = time.monotonic() + 10
        tables = ("replies", "chunks", "tickets", "sessions")
        while time.monotonic() < deadline and any(
            _count(schemas, config.db_schema, t) for t in tables
        ):
            time.sleep(0.1)
        assert [_count(schemas, config.db_schema, t) for t in tables] == [0, 0, 0, 0]
    finally:
        store.close()
        sessions.close()


# -- hostile ids -------------------------------------------------------------------------


def test_ids_with_sql_and_unicode_round_trip(schemas: Schemas) -> None:
    store = PostgresSessionStore(schemas.config())
    try:
        for session in ("'; DROP TABLE sessions; --", 'sé\\ss"ion', "%s %(id)s {s}"):
            store.save(session, {"v": session})
            assert store.load(session) == {"v": session}
    finally:
        store.close()


def test_a_nul_in_an_id_is_a_store_error(schemas: Schemas) -> None:
    store = PostgresSessionStore(schemas.config())
    try:
        with pytest.raises(SessionStoreError):
            store.read("bad\x00id")
    finally:
        store.close()


def test_a_request_id_too_long_to_notify_is_still_found_by_a_waiter(schemas: Schemas) -> None:
    store = PostgresResponseStore(schemas.config())
    record = ResponseRecord("r" * 9000, "s", 200, {"ok": True})
    try:
        writer = threading.Timer(0.2, store.put, (record,))
        writer.start()
        assert asyncio.run(store.wait(record.request_id, 5)) == record
        writer.join(5)
    finally:
        store.close()


def test_a_waiter_is_woken_by_a_write_in_another_process_s_store(schemas: Schemas) -> None:
    config = schemas.config()
    reader, writer = PostgresResponseStore(config), PostgresResponseStore(config)
    record = ResponseRecord(uuid.uuid4().hex, "s", 200, {"ok": True})
    try:
        timer = threading.Timer(0.3, writer.put, (record,))
        started = time.monotonic()
        timer.start()
        assert asyncio.run(reader.wait(record.request_id, 5)) == record
        assert time.monotonic() - started < 0.3 + 0.5  # woken, not the 1 s re-read
        timer.join(5)
    finally:
        reader.close()
        writer.close()


def _fails_then_recovers(call: object, cut: Proxy, error: type[Exception]) -> float:
    """Cut the proxy, check ``call`` fails with ``error``; restore it and wait for ``call`` to
    succeed again. Returns the seconds the failing call took."""
    assert callable(call)
    cut.stop()
    started = time.monotonic()
    with pytest.raises(error):
        call()
    took = time.monotonic() - started
    cut.start()
    deadline = time.monotonic() + 15
    while True:
        try:
            call()
            return took
        except error:
            assert time.monotonic() < deadline, "never recovered"
            time.sleep(0.2)


def test_stores_fail_fast_during_an_outage_and_recover(schemas: Schemas) -> None:
    cut = Proxy(schemas.dsn)
    cut.start()
    config = schemas.config()
    proxied = config.model_copy(update={"dsn": cut.dsn, "connect_timeout": 1.0})
    store, sessions = PostgresResponseStore(proxied), PostgresSessionStore(proxied)
    try:
        store.put(ResponseRecord("r", "s", 200, {}))
        assert _fails_then_recovers(lambda: store.get("r"), cut, StoreUnavailableError) < 5
        assert _fails_then_recovers(store.ping, cut, StoreUnavailableError) < 5
        assert _fails_then_recovers(lambda: sessions.read("s"), cut, StoreUnavailableError) < 5
        # The response store's idle connections died unseen in the last cut: the first call
        # meets one and fails, and makes the pool drop the others, so the next one works.
        with contextlib.suppress(StoreUnavailableError):
            store.get("r")
        assert store.get("r") == ResponseRecord("r", "s", 200, {})
    finally:
        cut.stop()
        store.close()
        sessions.close()
