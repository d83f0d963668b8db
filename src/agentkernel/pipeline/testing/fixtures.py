"""The hooks a contract subclass overrides, and the fixtures and helpers its cases use."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.sync_face import SyncConsumer, SyncTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName


class ContractFixtures:
    """Base of :class:`~agentkernel.pipeline.testing.QueueTransportContract` (which documents
    and sets the waits)."""

    fetch_wait: ClassVar[float]
    empty_wait: ClassVar[float]
    ack_wait: ClassVar[float]

    # -- hooks ---------------------------------------------------------------------------

    def make_transport(self) -> QueueTransport | Any:
        """Return a fresh transport whose queues no other test uses: async, or blocking (it is
        then adapted as the pipeline adapts it)."""
        raise NotImplementedError

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of broker time pass."""
        time.sleep(seconds)

    def force_redelivery(self) -> None:
        """Let every lease run out, so unacknowledged messages can be delivered again.

        Upstream's name for the hook: by default it advances past ``ack_wait``, so a subclass
        overrides either this (a broker that can expire leases on demand) or :meth:`advance`.
        """
        self.advance(self.ack_wait + 0.2)

    def distinct_groups(self, n: int) -> list[str]:
        """``n`` group ids the transport can run in parallel (override for partitioned brokers,
        where two sessions that share a partition are served one after the other)."""
        return [f"s{i}" for i in range(1, n + 1)]

    def open_consumers(self, transport: Any, queue: QueueName) -> int | None:
        """How many consumers of ``queue`` hold broker resources, or ``None`` if unknowable.

        ``transport`` is what :meth:`make_transport` returned (so is ``send_undecodable``'s).
        """
        return None

    # -- fixtures and helpers ------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _close_consumers(self) -> Iterator[None]:
        self._consumers: list[SyncConsumer] = []
        self._transports: list[SyncTransport] = []
        yield
        for consumer in self._consumers:
            consumer.close()
        for transport in self._transports:
            transport.close()

    @pytest.fixture
    def transport(self) -> SyncTransport:
        """The transport :meth:`make_transport` made, through the sync face the cases use."""
        transport = SyncTransport(self.make_transport())
        self._transports.append(transport)
        return transport

    def consumer(self, transport: SyncTransport, queue: QueueName) -> SyncConsumer:
        consumer = transport.create_consumer(queue)
        self._consumers.append(consumer)
        return consumer

    @staticmethod
    def msg(body: str, group: str | None = "g1", dedup: str | None = None) -> QueueMessage:
        return QueueMessage(
            body=body,
            group_id=group,
            dedup_id=dedup or uuid.uuid4().hex,
            attributes={"request_id": uuid.uuid4().hex},
        )

    def fetch_one(self, consumer: SyncConsumer) -> QueueMessage:
        got = self.fetch_n(consumer, 1)
        assert len(got) == 1, f"expected one message within {self.fetch_wait}s, got {len(got)}"
        return got[0]

    def fetch_n(self, consumer: SyncConsumer, n: int) -> list[QueueMessage]:
        """Fetch until ``n`` messages arrived or ``fetch_wait`` passed; never acks."""
        got: list[QueueMessage] = []
        deadline = time.monotonic() + self.fetch_wait
        while len(got) < n and (remaining := deadline - time.monotonic()) > 0:
            got.extend(consumer.fetch(n - len(got), min(remaining, 1.0)))
        return got

    def assert_empty(self, consumer: SyncConsumer) -> None:
        assert consumer.fetch(10, self.empty_wait) == []

    # -- upstream's helper names, for cases a subclass written against upstream adds ---------

    @staticmethod
    def _msg(
        body: str = "{}",
        group_id: str | None = None,
        dedup_id: str | None = None,
        attributes: dict[str, str] | None = None,
    ) -> QueueMessage:
        return QueueMessage(
            body=body, group_id=group_id, dedup_id=dedup_id, attributes=attributes or {}
        )

    def _consumer(
        self, transport: SyncTransport, queue: QueueName = QueueName.INPUT
    ) -> SyncConsumer:
        return self.consumer(transport, queue)

    def _pair(self, queue: QueueName = QueueName.INPUT) -> tuple[SyncTransport, SyncConsumer]:
        transport = SyncTransport(self.make_transport())
        self._transports.append(transport)
        return transport, self.consumer(transport, queue)
