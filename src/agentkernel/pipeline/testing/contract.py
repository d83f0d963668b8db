"""The cases of the contract suite; see :mod:`agentkernel.pipeline.testing`."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from typing import ClassVar

import pytest

from agentkernel.core.errors import TransportError
from agentkernel.pipeline.testing.capabilities import Capabilities, implements
from agentkernel.pipeline.testing.watch import GroupLockWatch
from agentkernel.pipeline.transport.sync_face import SyncConsumer, SyncTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName


class QueueTransportContract(Capabilities):
    """Test cases for a transport; see :mod:`agentkernel.pipeline.testing`.

    The cases call the transport through its sync face
    (:class:`~agentkernel.pipeline.transport.sync_face.SyncTransport`), over the async API the
    pipeline uses: a blocking transport is adapted first, as the pipeline adapts it.
    """

    #: Lease (visibility timeout / ack wait) the transport under test was configured with, s.
    ack_wait: ClassVar[float] = 1.0
    #: Dedup window the transport under test was configured with, in seconds.
    dedup_window: ClassVar[float] = 2.0
    #: Ceiling for a fetch that is expected to return something, in seconds.
    fetch_wait: ClassVar[float] = 5.0
    #: Wait used for fetches that are expected to come back empty, in seconds.
    empty_wait: ClassVar[float] = 0.3
    #: Body size for the large-message round trip, in bytes.
    large_body_bytes: ClassVar[int] = 200_000
    #: Delay asked of a delayed ``nack`` by its case, in seconds (whole: SQS takes no less).
    nack_delay: ClassVar[float] = 2.0

    # -- the six guarantees ----------------------------------------------------------------

    def test_roundtrip_preserves_envelope(self, transport: SyncTransport) -> None:
        attributes = {
            "request_id": "req-1",
            "user_id": "  padded  ",
            "empty": "",
            "unicode": "héllo → 日本 ✓",
            "json": '{"a": [1, 2]}',
        }
        body = '{"prompt": "héllo\\n✓ 日本語", "n": 1}'
        transport.send(
            QueueName.INPUT,
            QueueMessage(body=body, attributes=attributes, group_id="s-1", dedup_id="d-1"),
        )
        got = self.fetch_one(self.consumer(transport, QueueName.INPUT))
        assert got.body == body
        assert got.attributes == attributes
        assert got.group_id == "s-1"
        assert got.receive_count == 1
        assert got.message_id

    def test_large_body_roundtrip(self, transport: SyncTransport) -> None:
        body = "x" * self.large_body_bytes
        transport.send(QueueName.INPUT, self.msg(body))
        assert self.fetch_one(self.consumer(transport, QueueName.INPUT)).body == body

    def test_per_group_fifo_one_in_flight(self, transport: SyncTransport) -> None:
        for body in ("first", "second"):
            transport.send(QueueName.INPUT, self.msg(body, group="s1"))
        consumer = self.consumer(transport, QueueName.INPUT)
        first = self.fetch_one(consumer)
        assert first.body == "first"
        self.assert_empty(consumer)  # the group is locked while "first" is in flight
        consumer.ack(first)
        assert self.fetch_one(consumer).body == "second"

    def test_distinct_groups_run_in_parallel(self, transport: SyncTransport) -> None:
        groups = self.distinct_groups(3)
        for group in groups:
            transport.send(QueueName.INPUT, self.msg(group, group=group))
        got = self.fetch_n(self.consumer(transport, QueueName.INPUT), 3)
        assert sorted(m.body for m in got) == sorted(groups)

    def test_batch_size_is_respected(self, transport: SyncTransport) -> None:
        for group in self.distinct_groups(3):
            transport.send(QueueName.INPUT, self.msg(group, group=group))
        consumer = self.consumer(transport, QueueName.INPUT)
        first = consumer.fetch(2, self.fetch_wait)
        assert 1 <= len(first) <= 2
        rest = self.fetch_n(consumer, 3 - len(first))
        assert len(first) + len(rest) == 3

    def test_fetch_on_empty_queue_returns_within_wait(self, transport: SyncTransport) -> None:
        consumer = self.consumer(transport, QueueName.INPUT)
        started = time.monotonic()
        assert consumer.fetch(5, self.empty_wait) == []
        assert time.monotonic() - started < self.empty_wait + 1.5

    def test_fetch_wakes_early_when_a_message_arrives(self, transport: SyncTransport) -> None:
        consumer = self.consumer(transport, QueueName.INPUT)
        timer = threading.Timer(0.2, transport.send, (QueueName.INPUT, self.msg("late")))
        timer.start()
        started = time.monotonic()
        try:
            got = self.fetch_n(consumer, 1)
        finally:
            timer.join(5)
        assert [m.body for m in got] == ["late"]
        assert time.monotonic() - started < self.fetch_wait

    def test_queues_are_isolated(self, transport: SyncTransport) -> None:
        transport.send(QueueName.INPUT, self.msg("for-input"))
        self.assert_empty(self.consumer(transport, QueueName.OUTPUT))
        assert self.fetch_one(self.consumer(transport, QueueName.INPUT)).body == "for-input"

    # -- acknowledgement and redelivery ---------------------------------------------------

    def test_ack_removes_message_for_good(self, transport: SyncTransport) -> None:
        transport.send(QueueName.INPUT, self.msg("once"))
        consumer = self.consumer(transport, QueueName.INPUT)
        consumer.ack(self.fetch_one(consumer))
        self.force_redelivery()
        self.assert_empty(consumer)

    def test_nack_redelivers_with_incremented_count(self, transport: SyncTransport) -> None:
        transport.send(QueueName.INPUT, self.msg("retry-me"))
        consumer = self.consumer(transport, QueueName.INPUT)
        consumer.nack(self.fetch_one(consumer))
        again = self.fetch_one(consumer)
        assert (again.body, again.receive_count) == ("retry-me", 2)

    def test_nack_with_a_delay_redelivers_after_it(self, transport: SyncTransport) -> None:
        transport.send(QueueName.INPUT, self.msg("later"))
        consumer = self.consumer(transport, QueueName.INPUT)
        first = self.fetch_one(consumer)
        if not self.capable("delayed_nack", consumer, "nack_later"):
            # Not offered: the answer must say so, so the loop keeps the message for the delay.
            assert consumer.nack(first, self.nack_delay) is False
            self.assert_empty(consumer)  # and nothing was handed back meanwhile
            consumer.ack(first)
            return
        assert consumer.nack(first, self.nack_delay) is True
        self.assert_empty(consumer)  # not at once
        self.advance(self.nack_delay)
        again = self.fetch_one(consumer)
        assert (again.body, again.receive_count) == ("later", 2)

    def test_receive_count_is_exact_over_several_deliveries(self, transport: SyncTransport) -> None:
        transport.send(QueueName.INPUT, self.msg("poison"))
        consumer = self.consumer(transport, QueueName.INPUT)
        counts = []
        for _ in range(4):
            got = self.fetch_one(consumer)
            counts.append(got.receive_count)
            consumer.nack(got)
        assert counts == [1, 2, 3, 4]

    def test_unacked_message_is_redelivered_after_lease(self, transport: SyncTransport) -> None:
        transport.send(QueueName.INPUT, self.msg("slow"))
        consumer = self.consumer(transport, QueueName.INPUT)
        assert self.fetch_one(consumer).receive_count == 1
        self.force_redelivery()
        again = self.fetch_one(consumer)
        assert (again.body, again.receive_count) == ("slow", 2)

    def test_stale_handle_ack_is_harmless(self, transport: SyncTransport) -> None:
        transport.send(QueueName.INPUT, self.msg("a1", group="s1"))
        transport.send(QueueName.INPUT, self.msg("a2", group="s1"))
        consumer = self.consumer(transport, QueueName.INPUT)
        stale = self.fetch_one(consumer)
        self.force_redelivery()
        current = self.fetch_one(consumer)
        assert (current.body, current.receive_count) == ("a1", 2)
        consumer.ack(stale)  # must not release the group or remove the redelivered copy
        self.assert_empty(consumer)
        consumer.ack(current)
        assert self.fetch_one(consumer).body == "a2"

    def test_lease_extension_keeps_message_hidden(self, transport: SyncTransport) -> None:
        transport.send(QueueName.INPUT, self.msg("long-turn"))
        consumer = self.consumer(transport, QueueName.INPUT)
        got = self.fetch_one(consumer)
        if not self.capable("lease_extension", consumer, "extend_lease"):
            # Not offered: the consumer must not report a lease the loop would try to extend.
            assert consumer.lease_seconds is None, "lease_seconds is set but extend_lease is not"
            consumer.ack(got)
            return
        for _ in range(3):
            self.advance(self.ack_wait * 0.6)
            consumer.extend_lease(got)
        self.assert_empty(consumer)  # 1.8 x ack_wait later, still in flight
        consumer.ack(got)

    def test_fetch_again_while_earlier_messages_are_unacked(self, transport: SyncTransport) -> None:
        one, two = self.distinct_groups(2)
        transport.send(QueueName.INPUT, self.msg("a", group=one))
        consumer = self.consumer(transport, QueueName.INPUT)
        first = self.fetch_one(consumer)
        transport.send(QueueName.INPUT, self.msg("b", group=two))
        second = self.fetch_one(consumer)
        assert (first.body, second.body) == ("a", "b")

    def test_ack_from_another_thread_during_a_blocked_fetch(self, transport: SyncTransport) -> None:
        for body in ("x1", "x2"):
            transport.send(QueueName.INPUT, self.msg(body, group="s1"))
        consumer = self.consumer(transport, QueueName.INPUT)
        first = self.fetch_one(consumer)
        acker = threading.Timer(0.2, consumer.ack, (first,))
        acker.start()
        try:
            second = self.fetch_one(consumer)
        finally:
            acker.join(5)
        assert second.body == "x2"

    def test_a_consumer_waiting_in_fetch_respects_the_group_lock(
        self, transport: SyncTransport
    ) -> None:
        consumers = [self.consumer(transport, QueueName.INPUT) for _ in range(2)]
        waiting = GroupLockWatch(consumers)
        waiting.start()
        time.sleep(0.5)  # both consumers are now waiting in fetch
        # The lease of "first" starts at its delivery, which is after this moment: a message
        # received before this moment plus the lease cannot be a lease-expiry redelivery.
        sent = time.monotonic()
        lease = self.ack_wait if self.timeout_redelivery else float("inf")
        transport.send(QueueName.INPUT, self.msg("first", group="locked"))
        waiting.wait_for("first", self.fetch_wait)
        transport.send(QueueName.INPUT, self.msg("second", group="locked"))
        # Give "second" the time a broker needs to hand it out wrongly, within the lease.
        waiting.stop_at(min(sent + lease, time.monotonic() + self.fetch_wait))
        bodies = sorted(body for at, body in waiting.join(self.fetch_wait) if at < sent + lease)
        assert bodies == ["first"], f"both messages of one group were in flight: {bodies}"

    # -- dedup -----------------------------------------------------------------------------

    def test_dedup_drops_a_duplicate_inside_the_window(self, transport: SyncTransport) -> None:
        transport.send(QueueName.INPUT, self.msg("one", dedup="same"))
        transport.send(QueueName.INPUT, self.msg("two", dedup="same"))
        consumer = self.consumer(transport, QueueName.INPUT)
        got = self.fetch_one(consumer)
        assert got.body == "one"
        consumer.ack(got)
        self.assert_empty(consumer)

    def test_dedup_accepts_the_id_after_the_window(self, transport: SyncTransport) -> None:
        transport.send(QueueName.INPUT, self.msg("one", dedup="again"))
        consumer = self.consumer(transport, QueueName.INPUT)
        consumer.ack(self.fetch_one(consumer))
        self.advance(self.dedup_window + 0.5)
        transport.send(QueueName.INPUT, self.msg("two", dedup="again"))
        assert self.fetch_one(consumer).body == "two"

    def test_send_awaited_on_a_callers_loop_sends_as_the_face_does(
        self, transport: SyncTransport
    ) -> None:
        """``send`` awaited on an event loop of the caller's: same envelope, same dedup."""
        first = self.msg("one", group="s-async", dedup="async-1")
        first.attributes["user_id"] = "  padded ✓ "

        async def send_twice() -> str | None:
            sent = await transport.transport.send(QueueName.INPUT, first)
            again = self.msg("two", group="s-async", dedup="async-1")
            await transport.transport.send(QueueName.INPUT, again)
            return sent

        assert asyncio.run(send_twice()) is not None  # the broker's id for a first send
        consumer = self.consumer(transport, QueueName.INPUT)
        got = self.fetch_one(consumer)
        assert (got.body, got.attributes, got.group_id) == ("one", first.attributes, "s-async")
        consumer.ack(got)
        self.assert_empty(consumer)

    # -- lifecycle and concurrency -----------------------------------------------------------

    def test_close_releases_the_consumer(self, transport: SyncTransport) -> None:
        consumer = transport.create_consumer(QueueName.INPUT)
        before = self.open_consumers(transport.broker, QueueName.INPUT)
        consumer.close()
        consumer.close()  # idempotent
        after = self.open_consumers(transport.broker, QueueName.INPUT)
        if before is not None:
            assert (before, after) == (1, 0)
        if implements(consumer, "close"):  # it holds something: once released, no more fetches
            with pytest.raises(TransportError):
                consumer.fetch(1, 0.01)

    def test_concurrent_producers_and_consumers_lose_nothing(
        self, transport: SyncTransport
    ) -> None:
        """Nothing lost, each group in order; a repeat is only allowed as a real redelivery
        (``receive_count > 1``, e.g. an ack that came after the lease under load)."""
        groups, per_group = 6, 15
        received: dict[str, list[tuple[int, int]]] = defaultdict(list)
        lock = threading.Lock()
        done = threading.Event()

        def produce(group: str) -> None:
            for i in range(per_group):
                transport.send(QueueName.INPUT, self.msg(str(i), group=group))

        def consume() -> None:
            consumer = self.consumer(transport, QueueName.INPUT)
            while not done.is_set():
                for m in consumer.fetch(4, 0.2):
                    with lock:
                        received[m.group_id or ""].append((int(m.body), m.receive_count))
                        if len({(g, b) for g, seq in received.items() for b, _ in seq}) == (
                            groups * per_group
                        ):
                            done.set()
                    consumer.ack(m)

        names = [f"g{i}" for i in range(groups)]  # sharing a partition is fine here
        threads = [threading.Thread(target=produce, args=(name,)) for name in names]
        threads += [threading.Thread(target=consume) for _ in range(3)]
        for t in threads:
            t.start()
        done.wait(self.fetch_wait * 6)
        done.set()
        for t in threads:
            t.join(10)
        assert sorted(received) == sorted(names), f"groups seen: {sorted(received)}"
        for name in names:
            deliveries = received[name]
            firsts = list(dict.fromkeys(body for body, _ in deliveries))
            assert firsts == list(range(per_group)), f"{name} lost or reordered: {deliveries}"
            seen: set[int] = set()
            for body, count in deliveries:
                assert body not in seen or count > 1, f"{name} delivered twice: {deliveries}"
                seen.add(body)

    # -- positions (how the runner recognises a replay past its id window) -----------------

    def test_positions_rise_within_a_group_and_stay_on_redelivery(
        self, transport: SyncTransport
    ) -> None:
        for body in ("1", "2", "3"):
            transport.send(QueueName.INPUT, self.msg(body, group="s1"))
        consumer = self.consumer(transport, QueueName.INPUT)
        first = self.fetch_one(consumer)
        consumer.nack(first)
        again = self.fetch_one(consumer)
        if self.positions is None and first.position is None:
            self._no_positions(consumer, again)  # detected: the transport sets none
            return
        assert again.body == "1" and again.position == first.position is not None
        seen = [again]
        consumer.ack(again)
        for _ in range(2):
            seen.append(self.fetch_one(consumer))
            consumer.ack(seen[-1])
        positions = [m.position for m in seen]
        assert len({p.unit for p in positions if p is not None}) == 1, positions
        sequences = [p.sequence for p in positions if p is not None]
        assert len(sequences) == 3 and sequences == sorted(set(sequences)), positions

    def _no_positions(self, consumer: SyncConsumer, again: QueueMessage) -> None:
        """A transport without positions sets none at all (a half-set one would mislead)."""
        seen = [again]
        consumer.ack(again)
        for _ in range(2):
            seen.append(self.fetch_one(consumer))
            consumer.ack(seen[-1])
        assert [m.body for m in seen] == ["1", "2", "3"]
        assert [m.position for m in seen] == [None] * 3
