"""A schema of its own per test on the real PostgreSQL server, dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from agentkernel.core.config import PostgresStoreConfig


class Schemas:
    """Unique schemas for one test; :meth:`drop_all` removes them."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.names: list[str] = []

    def config(self, name: str | None = None, **more: object) -> PostgresStoreConfig:
        """A store block on a new schema (or ``name``), provisioned unless said otherwise."""
        if name is None:
            name = f"t_{uuid.uuid4().hex[:12]}"
            self.names.append(name)
        settings: dict[str, object] = {"dsn": self.dsn, "db_schema": name, "auto_provision": True}
        return PostgresStoreConfig.model_validate(settings | more)

    def execute(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(statement)  # type: ignore[call-overload]

    def drop_all(self) -> None:
        for name in self.names:
            self.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def schemas(postgres_dsn: str) -> Iterator[Schemas]:
    made = Schemas(postgres_dsn)
    yield made
    made.drop_all()
