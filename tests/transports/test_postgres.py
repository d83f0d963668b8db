"""The PostgreSQL transport passes the whole contract on a real server, no capability off."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from agentkernel.core.config.queues import PostgresQueueConfig
from agentkernel.pipeline.postgres.schema import migrate
from agentkernel.pipeline.testing import QueueTransportContract
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.postgres import PostgresTransport
from agentkernel.pipeline.wire.envelope import QueueName

pytestmark = pytest.mark.postgres

#: What can be written to the table that the transport cannot decode.
KINDS = ("attributes_not_json", "attribute_not_text")


@pytest.fixture(scope="module")
def queue_schema(postgres_dsn: str) -> Iterator[tuple[str, str]]:
    name = f"tq_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        migrate(conn, name)
    yield postgres_dsn, name
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{name}" CASCADE')  # type: ignore[call-overload]


def queue_config(dsn: str, schema: str, **more: object) -> PostgresQueueConfig:
    tag = uuid.uuid4().hex[:10]
    settings = {"dsn": dsn, "db_schema": schema, "input_queue": f"in-{tag}"}
    settings |= {"output_queue": f"out-{tag}", "ack_wait": 1.0, "dedup_window": 2.0}
    return PostgresQueueConfig.model_validate(settings | more)


class TestPostgresTransportContract(QueueTransportContract):
    ack_wait = 1.0
    dedup_window = 2.0
    undecodable_kinds = KINDS

    @pytest.fixture(autouse=True)
    def _server(self, queue_schema: tuple[str, str]) -> None:
        self.dsn, self.schema = queue_schema

    def make_transport(self) -> QueueTransport:
        return PostgresTransport(queue_config(self.dsn, self.schema))

    def send_undecodable(
        self, transport: QueueTransport, queue: QueueName, kind: str, group: str, request_id: str
    ) -> str | None:
        assert isinstance(transport, PostgresTransport)
        if kind == "attributes_not_json":
            raw, expected = "{not json", None
        else:
            raw, expected = json.dumps({"request_id": request_id, "n": 1}), request_id
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                f'INSERT INTO "{self.schema}".queue_messages (queue, group_id, body, attributes) '  # type: ignore[call-overload]
                "VALUES (%s, %s, %s, %s)",
                [transport.names[queue], group, "{}", raw],
            )
        return expected
