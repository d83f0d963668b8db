"""The PostgreSQL transport beyond the contract: factory, dead letters, retention, refusals."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import psycopg
import pytest

from agentkernel.core.errors import AKConfigError, TransportError
from agentkernel.pipeline.transport.factory import QueueTransportFactory
from agentkernel.pipeline.transport.postgres import KEY, PostgresTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from tests import servers
from tests.stores.postgres_helpers import Proxy
from tests.transports.test_postgres import queue_config, queue_schema

__all__ = ["queue_schema"]
pytestmark = pytest.mark.postgres


def _rows(dsn: str, query: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query).fetchall()  # type: ignore[call-overload, no-any-return]


def test_the_factory_builds_it_and_requires_its_block(queue_schema: tuple[str, str]) -> None:
    block = queue_config(*queue_schema).model_dump()
    transport = QueueTransportFactory.create({"type": "postgres", "postgres": block})
    try:
        assert isinstance(transport, PostgresTransport)
    finally:
        transport.close()
    with pytest.raises(AKConfigError, match=r"execution\.queues\.postgres: block is required"):
        QueueTransportFactory.create({"type": "postgres"})


def test_a_dead_letter_is_kept_with_its_count_and_swept_after_retention(
    queue_schema: tuple[str, str],
) -> None:
    dsn, schema = queue_schema
    transport = PostgresTransport(queue_config(dsn, schema, dead_letter_retention=0.5))
    consumer = transport.create_consumer(QueueName.INPUT)
    try:
        transport.send(QueueName.INPUT, QueueMessage(body="poison", group_id="g"))
        consumer.nack(consumer.fetch(1, 5)[0])
        message = consumer.fetch(1, 5)[0]
        consumer.dead_letter(message)
        row_id = int(message.native[0])
        dead = f'SELECT body, receive_count FROM "{schema}".queue_dead WHERE id = {row_id}'
        assert _rows(dsn, dead) == [("poison", 2)]
        assert consumer.fetch(1, 0.3) == []
        time.sleep(0.6)
        transport.sweep()
        assert _rows(dsn, dead) == []
    finally:
        consumer.close()
        transport.close()


def test_messages_older_than_max_age_are_swept(queue_schema: tuple[str, str]) -> None:
    dsn, schema = queue_schema
    transport = PostgresTransport(queue_config(dsn, schema, max_age=0.3))
    consumer = transport.create_consumer(QueueName.INPUT)
    try:
        transport.send(QueueName.INPUT, QueueMessage(body="stale", group_id="g"))
        time.sleep(0.5)
        assert transport.sweep() >= 1
        assert consumer.fetch(1, 0.3) == []
    finally:
        consumer.close()
        transport.close()


def test_a_missing_schema_refuses_to_start_in_one_line(postgres_dsn: str) -> None:
    schema = f"tq_{uuid.uuid4().hex[:12]}"
    with pytest.raises(AKConfigError) as caught:
        PostgresTransport(queue_config(postgres_dsn, schema, auto_provision=False))
    text = str(caught.value)
    assert "\n" not in text and f"table {schema}.schema_version is missing" in text
    assert "agentkernel db migrate" in text


def test_an_unreachable_server_fails_in_seconds() -> None:
    port = servers.free_port()
    config = queue_config(f"postgresql://postgres@127.0.0.1:{port}/test", "agentkernel")
    started = time.monotonic()
    with pytest.raises(TransportError, match="PostgreSQL unavailable"):
        PostgresTransport(config.model_copy(update={"connect_timeout": 1.0}))
    assert time.monotonic() - started < 10
    # The failed constructor closed its pool: no worker is left for the garbage collector to
    # join from ``ConnectionPool.__del__`` (an unraisable exception in whatever test runs then).
    pool_threads = [t.name for t in threading.enumerate() if t.name.startswith(KEY)]
    assert pool_threads == []


def test_a_body_postgres_cannot_hold_is_a_transport_error(queue_schema: tuple[str, str]) -> None:
    transport = PostgresTransport(queue_config(*queue_schema))
    try:
        with pytest.raises(TransportError):
            transport.send(QueueName.INPUT, QueueMessage(body="nul\x00byte", group_id="g"))
    finally:
        transport.close()


@pytest.mark.parametrize(
    "settings",
    [{"input_queue": ""}, {"output_queue": "x" * 201}, {"ack_wait": 0}, {"max_age": -1}],
)
def test_hostile_queue_settings_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        queue_config("postgresql://127.0.0.1/x", "agentkernel", **settings)


def test_an_outage_fails_calls_in_seconds_and_the_queue_recovers(
    queue_schema: tuple[str, str],
) -> None:
    cut = Proxy(queue_schema[0])
    cut.start()
    config = queue_config(cut.dsn, queue_schema[1], connect_timeout=1.0)
    transport = PostgresTransport(config)
    consumer = transport.create_consumer(QueueName.INPUT)
    try:
        transport.send(QueueName.INPUT, QueueMessage(body="before", group_id="g"))
        cut.stop()
        started = time.monotonic()
        with pytest.raises(TransportError, match="PostgreSQL unavailable"):
            transport.send(QueueName.INPUT, QueueMessage(body="during", group_id="g"))
        with pytest.raises(TransportError, match="PostgreSQL unavailable"):
            consumer.fetch(1, 0.5)
        assert time.monotonic() - started < 5
        cut.start()
        deadline = time.monotonic() + 15
        got: list[QueueMessage] = []
        while not got and time.monotonic() < deadline:
            with contextlib.suppress(TransportError):
                got = consumer.fetch(1, 1.0)
        assert [(m.body, m.receive_count) for m in got] == [("before", 1)]
        consumer.ack(got[0])
    finally:
        cut.stop()
        consumer.close()
        transport.close()


def test_a_waiting_fetch_wakes_as_soon_as_a_message_is_sent(
    queue_schema: tuple[str, str],
) -> None:
    """The listener hands each notification on as it arrives, not once per listening tick (it
    once collected a whole tick's notifications first: a waiting fetch woke 0-0.5 s late, 0.25 s
    on average, which the mean over 8 sends at staggered times shows whatever the load)."""
    transport = PostgresTransport(queue_config(*queue_schema))
    consumer = transport.create_consumer(QueueName.INPUT)
    late: list[float] = []
    try:
        consumer.fetch(1, 0.3)  # the listener is up
        for i in range(8):
            delay = 0.2 + 0.06 * i
            message = QueueMessage(body=str(i))
            sent = threading.Timer(delay, transport.send, [QueueName.INPUT, message])
            sent.start()
            started = time.monotonic()
            got = consumer.fetch(1, 5.0)
            late.append(time.monotonic() - started - delay)
            consumer.ack(got[0])
            sent.join()
    finally:
        consumer.close()
        transport.close()
    assert sum(late) / len(late) < 0.12, late


def test_one_notification_wakes_one_waiting_consumer(queue_schema: tuple[str, str]) -> None:
    """A send wakes one of the process's waiting fetches, not every one of them (each woken
    fetch claims, and all but one came back empty); the others wait out their slice."""
    dsn, schema = queue_schema
    transport = PostgresTransport(queue_config(dsn, schema))
    channel = transport.channel(QueueName.INPUT)
    woke: list[float] = []
    try:
        seen = transport.wakeups.generation(channel)
        time.sleep(0.3)  # the listener is up
        seen = transport.wakeups.generation(channel)
        started = time.monotonic()

        def wait() -> None:
            transport.wakeups.wait(channel, seen, 3.0)
            woke.append(time.monotonic() - started)

        waiters = [threading.Thread(target=wait) for _ in range(4)]
        for waiter in waiters:
            waiter.start()
        time.sleep(0.5)  # all four are waiting
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, '')", [channel])
        for waiter in waiters:
            waiter.join(5.0)
    finally:
        transport.close()
    assert sum(1 for t in woke if t < 2.0) == 1, woke
    assert len(woke) == 4


def test_a_waiting_fetch_takes_a_delayed_message_when_its_delay_ends(
    queue_schema: tuple[str, str],
) -> None:
    """Nothing notifies when a delay (or a lease) runs out: an empty claim also says when the
    next message may become fetchable, and the fetch sleeps until then, not its whole wait."""
    transport = PostgresTransport(queue_config(*queue_schema))
    consumer = transport.create_consumer(QueueName.INPUT)
    try:
        transport.send(QueueName.INPUT, QueueMessage(body="later", group_id="g"))
        consumer.nack_later(consumer.fetch(1, 5.0)[0], 0.6)
        started = time.monotonic()
        again = consumer.fetch(1, 4.0)
        took = time.monotonic() - started
        assert [m.body for m in again] == ["later"]
        assert 0.5 < took < 1.5, took
    finally:
        consumer.close()
        transport.close()
