"""A split topology on Kafka keeps its bookkeeping where a restart does not forget it."""

from __future__ import annotations

import pytest

from agentkernel.core.config.kafka import NO_SHARED_STORE
from agentkernel.core.config.root import AKConfig
from agentkernel.core.errors import AKConfigError

KAFKA = {"AK_EXECUTION__QUEUES__TYPE": "kafka", "AK_EXECUTION__QUEUES__KAFKA__GROUP_ID": "g"}


def load(monkeypatch: pytest.MonkeyPatch, **env: str) -> AKConfig:
    for key, value in (KAFKA | env).items():
        monkeypatch.setenv(key, value)
    return AKConfig.load()


def test_the_default_shares_the_session_stores_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka = load(
        monkeypatch,
        AK_SESSION__TYPE="redis",
        AK_SESSION__REDIS__URL="redis://sessions:6379/2",
        AK_EXECUTION__RESPONSE_STORE__TYPE="redis",
        AK_EXECUTION__RESPONSE_STORE__REDIS__URL="redis://replies:6379/1",
    ).execution.queues.kafka
    assert kafka is not None
    assert (kafka.bookkeeping, kafka.bookkeeping_redis_url) == ("redis", "redis://sessions:6379/2")


def test_else_the_response_stores_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka = load(
        monkeypatch,
        AK_EXECUTION__RESPONSE_STORE__TYPE="redis",
        AK_EXECUTION__RESPONSE_STORE__REDIS__URL="redis://replies:6379/1",
    ).execution.queues.kafka
    assert kafka is not None
    assert (kafka.bookkeeping, kafka.bookkeeping_redis_url) == ("redis", "redis://replies:6379/1")


def test_an_explicit_url_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka = load(
        monkeypatch,
        AK_SESSION__TYPE="redis",
        AK_SESSION__REDIS__URL="redis://sessions:6379/2",
        AK_EXECUTION__QUEUES__KAFKA__BOOKKEEPING_REDIS_URL="redis://books:6379/0",
    ).execution.queues.kafka
    assert kafka is not None
    assert (kafka.bookkeeping, kafka.bookkeeping_redis_url) == ("redis", "redis://books:6379/0")


def test_in_memory_stays_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load(
        monkeypatch,
        AK_SESSION__TYPE="redis",
        AK_SESSION__REDIS__URL="redis://sessions:6379/2",
        AK_EXECUTION__QUEUES__KAFKA__BOOKKEEPING="in_memory",
    )
    assert config.execution.queues.kafka is not None
    assert config.execution.queues.kafka.bookkeeping == "in_memory"


def test_without_a_shared_store_the_transport_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("confluent_kafka")
    from agentkernel.pipeline.transport.kafka import KafkaTransport

    config = load(monkeypatch, AK_EXECUTION__RESPONSE_STORE__TYPE="dynamodb")
    settings = config.execution.queues.kafka
    assert settings is not None and settings.bookkeeping == "shared"
    with pytest.raises(AKConfigError) as raised:
        KafkaTransport(settings)  # refused before any broker is contacted
    assert str(raised.value) == NO_SHARED_STORE and "\n" not in NO_SHARED_STORE
