"""Configuration drift between processes on NATS (issue 23): counts, consumers, deleted objects.

Each test changes or deletes streams, so they run on a private nats-server of their own.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentkernel.core.config.queues import NatsQueueConfig
from agentkernel.core.errors import AKConfigError, TransportError
from agentkernel.pipeline.transport.nats import NatsTransport, partition_of
from agentkernel.pipeline.transport.nats.watch import CHECK_SECONDS
from agentkernel.pipeline.transport.sync_face import SyncTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from tests.chaos.infra import PrivateNats
from tests.transports.nats_sync import nats

pytestmark = pytest.mark.nats


@pytest.fixture(scope="module")
def private_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateNats]:
    server = PrivateNats(Path(tmp_path_factory.mktemp("nats-drift")))
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    NatsTransport.reset()


@pytest.fixture
def config(private_nats: PrivateNats) -> NatsQueueConfig:
    tag = uuid.uuid4().hex[:10].upper()
    return NatsQueueConfig(
        url=private_nats.url,
        input_stream=f"IN_{tag}",
        input_subject_prefix=f"d{tag}.in",
        output_stream=f"OUT_{tag}",
        output_subject_prefix=f"d{tag}.out",
        partitions=4,
        ack_wait=45.0,
        duplicate_window=2.0,
        retry_backoff=0,
        auto_provision=True,
    )


def group_on(partition: int, partitions: int) -> str:
    return next(g for i in range(10_000) if partition_of(g := f"s{i}", partitions) == partition)


def consumer(transport: SyncTransport, stream: str, durable: str) -> Any:
    return transport.run(transport.conn.js.consumer_info(stream, durable)).config


def delete_streams(transport: SyncTransport, config: NatsQueueConfig) -> None:
    for stream in (config.input_stream, config.output_stream):
        transport.run(transport.conn.js.delete_stream(stream))


def test_an_io_process_never_rewrites_the_runners_input_consumers(
    config: NatsQueueConfig,
) -> None:
    """An IO process with another ack_wait rewrote INPUT's consumers, which the runners own."""
    runner = nats(config)
    runner.create_consumer(QueueName.INPUT).close()
    io = nats(config.model_copy(update={"ack_wait": 20.0}))
    io.create_consumer(QueueName.OUTPUT).close()
    for p in range(config.partitions):
        assert consumer(io, config.input_stream, f"{config.input_stream}-p{p}").ack_wait == 45.0
        assert consumer(io, config.output_stream, f"{config.output_stream}-p{p}").ack_wait == 20.0
    runner._watch.check_now()
    assert runner.fault(QueueName.INPUT) == ""  # the runner keeps its settings and works


def test_a_stream_for_fewer_partitions_refuses_a_publish_to_a_removed_one(
    config: NatsQueueConfig,
) -> None:
    """The broker itself refuses what a process with the old count sends to a lost partition."""
    old = nats(config.model_copy(update={"partitions": 8}))
    delete_streams(old, config)
    nats(config)  # re-provisioned for 4 partitions
    with pytest.raises(TransportError):  # before its watch noticed anything
        old.send(QueueName.INPUT, QueueMessage(body="x", group_id=group_on(6, 8)))


def test_a_partition_count_changed_under_a_running_process_refuses_it_loudly(
    config: NatsQueueConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """The old count's process kept sending (8/16 sessions never answered) and stayed ready."""
    old = nats(config.model_copy(update={"partitions": 8}))
    delete_streams(old, config)
    nats(config).create_consumer(QueueName.INPUT).close()
    caplog.set_level(logging.WARNING, logger="agentkernel.pipeline.transport.nats")
    old._watch.check_now()
    old._watch.check_now()
    with pytest.raises(TransportError, match=r"partitions is 8 but .* for 4 partitions"):
        old.send(QueueName.INPUT, QueueMessage(body="x", group_id=group_on(1, 8)))
    with pytest.raises(TransportError, match="partitions is 8"):
        old.ping()  # GET /ready fails
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and all("Set partitions: 4" in r.getMessage() for r in errors)
    with pytest.raises(AKConfigError, match=r"partitions is 8 but .* for 4 partitions"):
        nats(config.model_copy(update={"partitions": 8}))  # and it cannot start again


def test_the_watch_finds_a_change_within_its_interval(config: NatsQueueConfig) -> None:
    old = nats(config.model_copy(update={"partitions": 8}))
    delete_streams(old, config)
    nats(config)
    deadline = time.monotonic() + CHECK_SECONDS + 3
    while not old.fault(QueueName.INPUT):
        assert time.monotonic() < deadline, "the change went unnoticed"
        time.sleep(0.1)


def test_a_deleted_input_consumer_is_recreated_with_auto_provision(
    config: NatsQueueConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """Its partition stalled with nothing logged."""
    runner = nats(config)
    fetcher = runner.create_consumer(QueueName.INPUT)
    runner.run(runner.conn.js.delete_consumer(config.input_stream, f"{config.input_stream}-p1"))
    runner.send(QueueName.INPUT, QueueMessage(body="on p1", group_id=group_on(1, 4)))
    caplog.set_level(logging.WARNING, logger="agentkernel.pipeline.transport.nats")
    runner._watch.check_now()
    assert f"recreated NATS consumer {config.input_stream}-p1" in caplog.text
    assert runner.fault(QueueName.INPUT) == ""
    got = fetcher.fetch(1, 5.0)
    assert [m.body for m in got] == ["on p1"]
    fetcher.ack(got[0])
    fetcher.close()


def test_a_deleted_consumer_without_auto_provision_fails_ready_and_fetches_nothing(
    config: NatsQueueConfig,
) -> None:
    nats(config).create_consumer(QueueName.INPUT).close()
    runner = nats(config.model_copy(update={"auto_provision": False}))
    fetcher = runner.create_consumer(QueueName.INPUT)
    runner.send(QueueName.INPUT, QueueMessage(body="kept", group_id=group_on(2, 4)))
    runner.run(runner.conn.js.delete_consumer(config.input_stream, f"{config.input_stream}-p1"))
    runner._watch.check_now()
    with pytest.raises(TransportError, match=f"'{config.input_stream}-p1' .* does not exist"):
        runner.ping()
    assert fetcher.fetch(1, 0.2) == []  # takes nothing it may not be able to serve in order
    fetcher.close()


def test_a_deleted_output_stream_is_recreated_with_auto_provision(
    config: NatsQueueConfig,
) -> None:
    io = nats(config)
    fetcher = io.create_consumer(QueueName.OUTPUT)
    io.run(io.conn.js.delete_stream(config.output_stream))
    io._watch.check_now()
    assert io.fault(QueueName.OUTPUT) == ""
    io.send(QueueName.OUTPUT, QueueMessage(body="reply", group_id="g"))
    got = fetcher.fetch(1, 5.0)
    assert [m.body for m in got] == ["reply"]
    fetcher.ack(got[0])
    fetcher.close()


def test_a_deleted_output_stream_without_auto_provision_refuses_sends_and_ready(
    config: NatsQueueConfig,
) -> None:
    nats(config)
    runner = nats(config.model_copy(update={"auto_provision": False}))
    runner.run(runner.conn.js.delete_stream(config.output_stream))
    runner._watch.check_now()
    with pytest.raises(TransportError, match=f"stream '{config.output_stream}' does not exist"):
        runner.send(QueueName.OUTPUT, QueueMessage(body="reply", group_id="g"))
    with pytest.raises(TransportError, match=config.output_stream):
        runner.ping()


def test_consumer_settings_changed_by_another_runner_stop_the_old_one(
    config: NatsQueueConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """Runners configured for 45 s ran under a 20 s ack_wait another process had set."""
    old = nats(config)
    fetcher = old.create_consumer(QueueName.INPUT)
    caplog.set_level(logging.WARNING, logger="agentkernel.pipeline.transport.nats")
    nats(config.model_copy(update={"ack_wait": 20.0})).create_consumer(QueueName.INPUT)
    assert "ack_wait 45.0 (configured: 20.0)" in caplog.text  # the update is not silent
    old._watch.check_now()
    assert "ack_wait 20.0 (configured: 45.0)" in old.fetch_fault(QueueName.INPUT)
    old.send(QueueName.INPUT, QueueMessage(body="x", group_id="g"))  # sending is unaffected
    assert fetcher.fetch(1, 0.2) == []
    fetcher.close()
