"""Turn signals in PostgreSQL (real server, one schema per test) pass the contract, and leave
no row behind."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from tests.stores.postgres_helpers import Schemas, schemas

from agentkernel.core.errors import SessionStoreUnavailableError
from agentkernel.pipeline.session_store.postgres import PostgresSessionStore
from agentkernel.pipeline.turn_control import Stop, StopKind, TurnSignals
from agentkernel.pipeline.turn_control.signals_postgres import PostgresTurnSignals
from agentkernel.pipeline.turn_control.testing import TurnSignalsContract

__all__ = ["schemas"]  # the fixture, used by name

pytestmark = pytest.mark.postgres


class TestPostgresTurnSignals(TurnSignalsContract):
    @pytest.fixture(autouse=True)
    def _schema(self, schemas: Schemas) -> Iterator[None]:
        self.config, self.dsn = schemas.config(), schemas.dsn
        self.stores: list[PostgresSessionStore] = []
        yield
        for store in self.stores:
            store.close()

    def make_signals(self, ttl: float = 60.0, stale_after: float = 60.0) -> TurnSignals:
        store = PostgresSessionStore(self.config)
        self.stores.append(store)
        return PostgresTurnSignals(store._db, ttl=ttl, stale_after=stale_after)

    def rows(self) -> list[str]:
        found = []
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for table in ("open_turns", "turn_signals"):
                query = sql.SQL("SELECT t::text FROM {} AS t")
                name = sql.Identifier(self.config.db_schema, table)
                found += [f"{table}: {row[0]}" for row in conn.execute(query.format(name))]
        return found

    def test_the_session_store_keeps_its_signals_in_its_schema(self) -> None:
        store = PostgresSessionStore(self.config)
        self.stores.append(store)
        signals = store.turn_signals(stale_after=30.0)
        assert isinstance(signals, PostgresTurnSignals) and signals.stale_after == 30.0
        signals.open("s", "r1")
        assert len(self.rows()) == 1 and "r1" in self.rows()[0]

    def test_closed_turns_and_forgotten_sessions_leave_nothing(self) -> None:
        signals = self.make_signals()
        signals.open("s", "a")
        signals.start("s", "a")
        signals.stop("s", "a", Stop(StopKind.CANCEL))
        signals.close("s", "a")
        assert self.rows() == []
        signals.open("t", "b")
        signals.stop("t", "b", Stop(StopKind.ROLLBACK, by="c"))
        signals.start("t", "d")
        signals.forget_session("t")
        assert self.rows() == []

    def test_the_sweeper_deletes_what_expired(self) -> None:
        store = PostgresSessionStore(self.config)
        self.stores.append(store)
        signals = PostgresTurnSignals(store._db, ttl=0.2, stale_after=0.2)
        signals.open("s", "queued")
        signals.start("s", "running")
        signals.stop("s", "stopped", Stop(StopKind.CANCEL))
        assert len(self.rows()) == 3
        time.sleep(0.3)
        assert store.sweep() == 3
        assert self.rows() == []

    def test_an_unreachable_server_is_an_outage(self, schemas: Schemas) -> None:
        config = schemas.config(dsn="postgresql://postgres@127.0.0.1:1/test", connect_timeout=1)
        store = PostgresSessionStore(config)
        self.stores.append(store)
        signals = store.turn_signals()
        assert signals is not None
        with pytest.raises(SessionStoreUnavailableError, match="PostgreSQL unavailable"):
            signals.start("s", "r")
