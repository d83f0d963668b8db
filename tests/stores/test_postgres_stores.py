"""The PostgreSQL stores pass the shared contracts on a real server, one schema per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentkernel.pipeline.quota import QuotaLedger
from agentkernel.pipeline.quota.testing import QuotaLedgerContract
from agentkernel.pipeline.response_store.base import ResponseStore
from agentkernel.pipeline.response_store.postgres import PostgresResponseStore
from agentkernel.pipeline.response_store.testing import ResponseStoreContract
from agentkernel.pipeline.session_store.base import SessionStore
from agentkernel.pipeline.session_store.postgres import PostgresSessionStore
from agentkernel.pipeline.session_store.testing import SessionStoreContract
from tests.stores.postgres_helpers import Schemas, schemas
from tests.stores.test_quota_ledgers import TURNS, SharedLedgerCases

__all__ = ["schemas"]  # the fixture, used by name


class _Stores:
    """Builds stores on one schema per test and closes them afterwards."""

    @pytest.fixture(autouse=True)
    def _schema(self, schemas: Schemas) -> Iterator[None]:
        self.config = schemas.config()
        self.schemas = schemas
        self.opened: list[PostgresResponseStore | PostgresSessionStore] = []
        yield
        for store in self.opened:
            store.close()


@pytest.mark.postgres
class TestPostgresResponseStore(_Stores, ResponseStoreContract):
    wake_latency = 0.5  # a notification is milliseconds; the rest is a loaded CI machine's

    def make_store(self, ttl: float) -> ResponseStore:
        store = PostgresResponseStore(self.config, ttl=ttl)
        self.opened.append(store)
        return store


@pytest.mark.postgres
class TestPostgresSessions(_Stores, SessionStoreContract):
    def make_store(self, ttl: float = 60) -> SessionStore:
        store = PostgresSessionStore(self.config, ttl=ttl)
        self.opened.append(store)
        return store


@pytest.mark.postgres
class TestPostgresLedger(_Stores, QuotaLedgerContract, SharedLedgerCases):
    def make_ledgers(self, ttl: float) -> tuple[QuotaLedger, QuotaLedger]:
        stores = [PostgresResponseStore(self.config, ttl=ttl) for _ in range(2)]
        self.opened.extend(stores)
        return stores[0].quota_ledger(), stores[1].quota_ledger()

    def forget(self, ledger: QuotaLedger, owner: str) -> None:
        schema = self.config.db_schema
        for table in ("quota_unread", "quota_bytes"):
            self.schemas.execute(f"DELETE FROM \"{schema}\".{table} WHERE owner = '{owner}'")

    def test_concurrent_admissions_never_pass_the_cap(self) -> None:
        import concurrent.futures
        import uuid

        first, second = self.make_ledgers(60.0)
        owner = self.owner()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            ledgers = [first, second] * 6
            waits = list(pool.map(lambda lg: lg.admit(owner, uuid.uuid4().hex, TURNS), ledgers))
        assert waits.count(None) == TURNS.unread_turns
