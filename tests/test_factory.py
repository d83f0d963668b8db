"""QueueTransportFactory: built-in chain, dotted-path transports, errors, the queues_config seam."""

from __future__ import annotations

import pytest

from agentkernel.core.config.queues import QueuesConfig
from agentkernel.core.config.root import AKConfig, AKConfigError
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.factory import QueueTransportFactory
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName


class TinyTransport(QueueTransport):
    """A bring-your-own transport: delegates to a private in-memory broker."""

    def __init__(self) -> None:
        self.inner = InMemoryTransport()

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        return self.inner.send(queue, message)

    def create_consumer(self, queue: QueueName):  # type: ignore[no-untyped-def]
        return self.inner.create_consumer(queue)


class NotATransport:
    pass


def test_default_is_the_shared_in_memory_transport() -> None:
    assert QueueTransportFactory.resolve_type() == "in_memory"
    first, second = QueueTransportFactory.create(), QueueTransportFactory.create()
    assert isinstance(first, InMemoryTransport)
    first.send(QueueName.INPUT, QueueMessage(body="x"))
    assert isinstance(second, InMemoryTransport) and second.depth(QueueName.INPUT) == 1


def test_dotted_path_transport_is_built_and_works() -> None:
    block = {"type": f"{__name__}.TinyTransport"}
    transport = QueueTransportFactory.create(block)
    assert isinstance(transport, TinyTransport)
    transport.send(QueueName.INPUT, QueueMessage(body="byo", group_id="g"))
    assert transport.create_consumer(QueueName.INPUT).fetch(1, 0.1)[0].body == "byo"
    consumer = QueueTransportFactory.create_consumer(
        QueueName.OUTPUT, QueuesConfig(type=block["type"])
    )
    assert consumer.fetch(1, 0.01) == []


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("rabbitmq", "unknown transport 'rabbitmq'"),
        (f"{__name__}.NotATransport", "not a subclass of QueueTransport"),
        ("no.such.module.Transport", "cannot import"),
    ],
)
def test_bad_types_are_config_errors(kind: str, message: str) -> None:
    with pytest.raises(AKConfigError, match=message):
        QueueTransportFactory.create({"type": kind})


@pytest.mark.parametrize("kind", ["nats", "kafka"])
def test_a_missing_backend_block_is_named(kind: str) -> None:
    with pytest.raises(AKConfigError, match=rf"execution\.queues\.{kind}"):
        QueueTransportFactory.create({"type": kind})


def test_sqs_needs_both_queue_urls() -> None:
    with pytest.raises(AKConfigError, match=r"execution\.queues\.input\.url"):
        QueueTransportFactory.create({"type": "sqs"})


def test_a_malformed_block_is_a_config_error() -> None:
    with pytest.raises(AKConfigError, match=r"execution\.queues"):
        QueueTransportFactory.create({"type": "in_memory", "input": {"no_of_consumers": -1}})


def test_explicit_block_is_used_instead_of_akconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AK_EXECUTION__QUEUES__TYPE", "my_pkg.Transport")
    AKConfig.reset()
    assert QueueTransportFactory.resolve_type({"type": "in_memory"}) == "in_memory"
    assert QueueTransportFactory.resolve_type() == "my_pkg.Transport"
