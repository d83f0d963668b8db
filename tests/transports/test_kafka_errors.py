"""Kafka client errors reach callers as the project's errors, never as confluent-kafka's."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from agentkernel.core.errors import AKConfigError
from agentkernel.pipeline.transport.bookkeeping import InMemoryBookkeepingStore
from agentkernel.pipeline.transport.kafka import KafkaTransport
from agentkernel.pipeline.wire.envelope import QueueName
from tests.transports.test_kafka import kafka_settings

pytestmark = pytest.mark.kafka


def test_a_client_setting_librdkafka_refuses_is_a_config_error_naming_it(
    tansu_broker: Any,
) -> None:
    settings = kafka_settings(tansu_broker.bootstrap, client_config={"no.such.property": "1"})
    with pytest.raises(AKConfigError, match=r"client_config.*no\.such\.property"):
        KafkaTransport(settings, InMemoryBookkeepingStore())


def test_a_consumer_setting_librdkafka_refuses_is_a_config_error_naming_it(
    tansu_broker: Any,
) -> None:
    settings = kafka_settings(
        tansu_broker.bootstrap, consumer_config={"session.timeout.ms": "not a number"}
    )
    transport = KafkaTransport(settings, InMemoryBookkeepingStore())
    try:
        with pytest.raises(AKConfigError, match=r"consumer_config.*session\.timeout\.ms"):
            transport.create_consumer(QueueName.INPUT)
    finally:
        transport.close()


def test_processes_provisioning_the_same_topics_at_once_all_start(tansu_broker: Any) -> None:
    """auto_provision in several replicas started together: a topic another one created is fine."""
    settings = kafka_settings(tansu_broker.bootstrap)
    errors: list[BaseException] = []
    go = threading.Barrier(4)

    def start() -> None:
        go.wait()
        try:
            KafkaTransport(settings, InMemoryBookkeepingStore()).close()
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
