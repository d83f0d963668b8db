"""Contract cases for messages a transport cannot decode; see :mod:`agentkernel.pipeline.testing`.

Anything can be published to a broker: a misconfigured producer, an old version, someone with
publish rights. A transport hands such a message out marked ``undecodable`` (never raising from
``fetch``), its neighbours go on undelayed, and once dead-lettered it does not come back.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from agentkernel.pipeline.consumer.handling import MessageHandling
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.testing.fixtures import ContractFixtures
from agentkernel.pipeline.transport.sync_face import SyncConsumer, SyncTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName


class UndecodableCases(ContractFixtures):
    """Cases run once per kind in ``undecodable_kinds`` (none: the cases are not collected)."""

    #: What can be published to this broker that the transport cannot decode, one name each
    #: (``send_undecodable`` publishes it); empty when nothing can.
    undecodable_kinds: ClassVar[tuple[str, ...]] = ()
    ack_wait: ClassVar[float]

    def send_undecodable(
        self, transport: Any, queue: QueueName, kind: str, group: str, request_id: str
    ) -> str | None:
        """Publish a message of ``kind`` natively, bypassing ``send``, on ``transport`` (what
        ``make_transport`` returned).

        Returns:
            the request id the message is expected to still carry, or ``None`` when ``kind``
            leaves it unreadable.
        """
        raise NotImplementedError

    def test_an_undecodable_message_neither_blocks_nor_returns(
        self, transport: SyncTransport
    ) -> None:
        for queue in QueueName:
            consumer = self.consumer(transport, queue)  # one per queue: a group member each
            for kind in self.undecodable_kinds:
                self._one_undecodable(transport, consumer, queue, kind)
            self.advance(self.ack_wait + 0.5)
            self.assert_empty(consumer)  # each dead-lettered once: none comes back

    def _one_undecodable(
        self, transport: SyncTransport, consumer: SyncConsumer, queue: QueueName, kind: str
    ) -> None:
        group, beside = self.distinct_groups(2)
        tag = uuid.uuid4().hex[:8]
        transport.send(queue, self.msg(f"before-{tag}", group=group))
        expected = self.send_undecodable(transport.broker, queue, kind, group, f"r-{tag}")
        transport.send(queue, self.msg(f"after-{tag}", group=group))
        transport.send(queue, self.msg(f"beside-{tag}", group=beside))
        bodies, foreign = self._settle_all(consumer, 4)
        where = f"{kind} on {queue}: {bodies}"
        assert [m.undecodable is not None for m in foreign] == [True], where
        assert foreign[0].attributes.get("request_id") == expected, f"{kind} on {queue}"
        assert sorted(bodies) == sorted(f"{b}-{tag}" for b in ("before", "after", "beside"))
        assert bodies.index(f"before-{tag}") < bodies.index(f"after-{tag}")

    def _settle_all(self, consumer: SyncConsumer, n: int) -> tuple[list[str], list[QueueMessage]]:
        """Fetch ``n`` messages, acking decodable ones and dead-lettering the others."""
        bodies: list[str] = []
        foreign: list[QueueMessage] = []
        deadline = time.monotonic() + 2 * self.fetch_wait
        while len(bodies) + len(foreign) < n and time.monotonic() < deadline:
            for m in consumer.fetch(n, 1.0):
                if m.undecodable is None:
                    bodies.append(m.body)
                    consumer.ack(m)
                else:
                    foreign.append(m)
                    consumer.dead_letter(m)
        return bodies, foreign

    def test_the_handling_dead_letters_an_undecodable_message_once(
        self, transport: SyncTransport, caplog: pytest.LogCaptureFixture
    ) -> None:
        kind, (group,) = self.undecodable_kinds[0], self.distinct_groups(1)
        rid = f"r-{uuid.uuid4().hex[:8]}"
        expected = self.send_undecodable(transport.broker, QueueName.INPUT, kind, group, rid)
        transport.send(QueueName.INPUT, self.msg("next", group=group))
        processed: list[str] = []
        refused: list[QueueMessage] = []
        handling = MessageHandling(
            lambda m: processed.append(m.body),
            lambda m: pytest.fail(f"permanent-failure hook ran for {m.message_id}"),
            queue="contract",
            on_undecodable=refused.append,
        )
        consumer = self.consumer(transport, QueueName.INPUT)
        before = _undecodable_count()
        with caplog.at_level(logging.ERROR, "agentkernel.pipeline.consumer.handling"):
            asyncio.run(self._handle_until(handling, consumer, lambda: processed == ["next"]))
        handling.close()
        assert [m.attributes.get("request_id") for m in refused] == [expected]
        assert _undecodable_count() == before + 1
        lines = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(lines) == 1 and str(refused[0].message_id) in lines[0].getMessage()
        self.advance(self.ack_wait + 0.5)
        self.assert_empty(consumer)

    async def _handle_until(
        self, handling: MessageHandling, consumer: SyncConsumer, done: Callable[[], bool]
    ) -> None:
        deadline = time.monotonic() + 2 * self.fetch_wait
        while not done() and time.monotonic() < deadline:
            for m in await asyncio.to_thread(consumer.fetch, 2, 1.0):
                await handling.begin(consumer.consumer, m)  # the async API behind the face


def _undecodable_count() -> float:
    prefix = 'agentkernel_undecodable_messages_total{queue="contract"} '
    for line in METRICS.render().splitlines():
        if line.startswith(prefix):
            return float(line.removeprefix(prefix))
    return 0.0
