"""Kafka: the session is the record key, acknowledgement is rebuilt on the client.

Kafka only tracks a committed offset per partition, so each consumer keeps the records it fetched
in offset order per partition and hands a record out when no earlier record of the same key is
pending: sessions sharing a partition still run in parallel, each session strictly one turn at a
time. The committed offset only moves past a prefix of finished records, so a crash redelivers
everything unfinished. ``nack`` puts the record back at the head of its session after
``retry_backoff`` seconds without holding up other sessions; ``dead_letter`` copies it to
``<topic><dlq_suffix>`` with an ``ak-error`` header, then commits it.

When a rebalance takes a partition away, the consumer first waits (up to
``rebalance_drain_timeout`` seconds) for the records it has in flight on that partition to be
settled and commits them, so the next owner does not start a session's turn while the previous
owner is still running it.

Receive counts and publish dedup live in a :class:`BookkeepingStore` (Redis for counts that
survive restarts). There is no lease: a record handed to a live but stuck worker is not redelivered
until its partition moves to another consumer (declared on the contract: ``timeout_redelivery``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from agentkernel.core.config import KafkaQueueConfig, QueuesConfig
from agentkernel.core.errors import (
    AKConfigError,
    MessageRejectedError,
    TransportClosedError,
    TransportError,
)
from agentkernel.pipeline.envelope import QueueMessage, QueueName
from agentkernel.pipeline.transport.base import (
    QueueTransport,
    TransportConsumer,
    require_block,
)
from agentkernel.pipeline.transport.bookkeeping import (
    BookkeepingStore,
    InMemoryBookkeepingStore,
    RedisBookkeepingStore,
)

logger = logging.getLogger(__name__)

ATTR_PREFIX = "ak-attr:"
DEDUP_HEADER = "ak-dedup-id"
MAX_MESSAGE_BYTES = 1_000_000
MAX_BUFFERED = 2000
_LIBRDKAFKA_LOG = logging.getLogger("agentkernel.kafka.librdkafka")


@dataclass(eq=False)
class _Entry:
    offset: int
    key: str
    record: Any
    owner: _Partition
    state: str = "ready"  # ready | inflight | done
    not_before: float = 0.0


@dataclass(eq=False)
class _Partition:
    topic: str
    number: int
    entries: deque[_Entry] = field(default_factory=deque)
    in_flight: set[str] = field(default_factory=set)
    next_offset: int = -1
    committed: int = -1


class KafkaTransport(QueueTransport):
    """INPUT and OUTPUT on two topics, one consumer group per queue.

    Args:
        settings: the ``execution.queues.kafka`` block.
        bookkeeping: receive counts and dedup claims; default from ``settings.bookkeeping``.
    """

    def __init__(self, settings: KafkaQueueConfig, bookkeeping: BookkeepingStore | None = None):
        self.settings = settings
        self.topics = {
            QueueName.INPUT: settings.input_topic,
            QueueName.OUTPUT: settings.output_topic,
        }
        self.bookkeeping = bookkeeping if bookkeeping is not None else _bookkeeping(settings)
        self._producer: Any = None
        self._lock = threading.Lock()
        self._admin = AdminClient(self._conf())
        self._check_topics()

    @classmethod
    def from_config(cls, block: QueuesConfig) -> KafkaTransport:
        settings: KafkaQueueConfig = require_block(block, "kafka")
        return cls(settings)

    def _conf(self, **extra: Any) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.settings.bootstrap_servers,
            "logger": _LIBRDKAFKA_LOG,
            **extra,
            **self.settings.client_config,
        }

    # -- topics -------------------------------------------------------------------------------

    def _all_topics(self) -> list[str]:
        names = list(self.topics.values())
        return names + [name + self.settings.dlq_suffix for name in names]

    def _metadata(self) -> Any:
        try:
            return self._admin.list_topics(timeout=self.settings.metadata_timeout)
        except KafkaException as exc:
            raise TransportError(f"Kafka at {self.settings.bootstrap_servers}: {exc}") from exc

    def _check_topics(self) -> None:
        missing = [t for t in self._all_topics() if t not in self._metadata().topics]
        if not missing:
            return
        if not self.settings.auto_provision:
            raise AKConfigError(
                f"execution.queues.kafka: topic(s) {', '.join(missing)} do not exist; create them "
                "(e.g. Strimzi KafkaTopic resources) or set auto_provision: true for development"
            )
        futures = self._admin.create_topics(
            [
                NewTopic(t, num_partitions=self.settings.partitions, replication_factor=1)
                for t in missing
            ]
        )
        for future in futures.values():
            future.result(self.settings.metadata_timeout)
        deadline = time.monotonic() + self.settings.metadata_timeout
        while any(t not in self._metadata().topics for t in missing):
            if time.monotonic() > deadline:
                raise TransportError(f"created topics {missing} did not appear in metadata")
            time.sleep(0.1)

    # -- sending --------------------------------------------------------------------------------

    def producer(self) -> Any:
        with self._lock:
            if self._producer is None:
                timeout_ms = int(self.settings.delivery_timeout * 1000)
                self._producer = Producer(
                    self._conf(
                        **{
                            "enable.idempotence": True,
                            "acks": "all",
                            "message.timeout.ms": timeout_ms,
                            "linger.ms": 0,
                        }
                    )
                )
            return self._producer

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        headers = [(ATTR_PREFIX + k, v.encode()) for k, v in message.attributes.items()]
        if message.dedup_id:
            headers.append((DEDUP_HEADER, message.dedup_id.encode()))
        key = message.group_id.encode() if message.group_id is not None else None
        return self.produce(self.topics[queue], message.body.encode(), key, headers)

    def produce(self, topic: str, value: bytes, key: bytes | None, headers: list[Any]) -> str:
        """Produce one record and wait for the broker to confirm it."""
        if len(value) > MAX_MESSAGE_BYTES:
            raise MessageRejectedError(
                f"message is {len(value)} bytes; Kafka allows {MAX_MESSAGE_BYTES}"
            )
        done = threading.Event()
        outcome: list[Any] = []

        def delivered(err: Any, record: Any) -> None:
            outcome[:] = [err, record]
            done.set()

        producer = self.producer()
        try:
            try:
                producer.produce(
                    topic, value=value, key=key, headers=headers, on_delivery=delivered
                )
            except BufferError:
                producer.poll(1.0)
                producer.produce(
                    topic, value=value, key=key, headers=headers, on_delivery=delivered
                )
        except (KafkaException, BufferError) as exc:
            raise TransportError(f"Kafka produce to {topic} failed: {exc}") from exc
        deadline = time.monotonic() + self.settings.delivery_timeout + 1
        while not done.is_set():
            if time.monotonic() > deadline:
                raise TransportError(f"Kafka did not confirm the record on {topic} in time")
            producer.poll(0.02)
        err, record = outcome
        if err is not None:
            raise TransportError(f"Kafka rejected the record on {topic}: {err}")
        return f"{topic}:{record.partition()}:{record.offset()}"

    # -- the rest of QueueTransport ------------------------------------------------------------

    def create_consumer(self, queue: QueueName) -> KafkaConsumer:
        return KafkaConsumer(self, QueueName(queue))

    def check_consumer_capacity(self, queue: QueueName, num_consumers: int) -> None:
        try:
            topic = self._metadata().topics.get(self.topics[queue])
        except TransportError:
            return
        partitions = len(topic.partitions) if topic is not None else 0
        if partitions < num_consumers:
            logger.warning(
                "%s consumers on topic %s with %s partitions: some will be idle",
                num_consumers,
                self.topics[queue],
                partitions,
            )

    def ping(self) -> None:
        self._metadata()

    def close(self) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(5)


class KafkaConsumer(TransportConsumer):
    """One consumer-group member; hands out records per key (see the module docstring)."""

    def __init__(self, transport: KafkaTransport, queue: QueueName) -> None:
        s = transport.settings
        self._transport = transport
        self._topic = transport.topics[queue]
        self._group = f"{s.group_id}-{queue}"
        self._books = transport.bookkeeping
        self._parts: dict[int, _Partition] = {}
        self._lock = threading.Condition()
        self._closed = False
        self._drain_timeout = s.rebalance_drain_timeout
        self._consumer = Consumer(
            transport._conf(
                **{
                    "group.id": self._group,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "max.poll.interval.ms": 900000,
                    "session.timeout.ms": 10000,
                    "heartbeat.interval.ms": 1000,
                    "fetch.wait.max.ms": 50,
                    **s.consumer_config,
                }
            )
        )
        self._consumer.subscribe(
            [self._topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._revoked
        )

    def _assigned(self, consumer: Any, partitions: list[Any]) -> None:
        with self._lock:
            for tp in partitions:
                self._parts[tp.partition] = _Partition(tp.topic, tp.partition)

    def _revoked(self, consumer: Any, partitions: list[Any]) -> None:
        numbers = {tp.partition for tp in partitions}
        deadline = time.monotonic() + (0.0 if self._closed else self._drain_timeout)
        with self._lock:
            moving = [p for n, p in self._parts.items() if n in numbers]
            while any(p.in_flight for p in moving) and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(left)  # let the turns in hand finish before handing over
            for part in moving:
                self._commit(part)
                del self._parts[part.number]  # the next owner starts at the committed offset

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        if self._closed:
            raise TransportClosedError(f"Kafka consumer of {self._topic} is closed")
        deadline = time.monotonic() + wait_seconds
        while True:
            with self._lock:
                out = self._take(batch_size)
                buffered = sum(len(p.entries) for p in self._parts.values())
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                return out
            if buffered >= MAX_BUFFERED:
                time.sleep(min(remaining, 0.05))
                continue
            try:
                records = self._consumer.consume(num_messages=500, timeout=min(remaining, 0.1))
            except KafkaException as exc:
                raise TransportError(f"Kafka consume from {self._topic} failed: {exc}") from exc
            self._buffer(records)

    def _buffer(self, records: list[Any]) -> None:
        with self._lock:
            for record in records:
                if record.error() is not None:
                    logger.warning("Kafka consumer error on %s: %s", self._topic, record.error())
                    continue
                part = self._parts.get(record.partition())
                if part is None or record.offset() < part.next_offset:
                    continue  # revoked meanwhile, or already buffered
                key = record.key().decode() if record.key() is not None else f"\0{record.offset()}"
                part.entries.append(_Entry(record.offset(), key, record, part))
                part.next_offset = record.offset() + 1

    def _take(self, batch_size: int) -> list[QueueMessage]:
        """Ready records whose session has nothing earlier pending, in offset order."""
        out: list[QueueMessage] = []
        now = time.monotonic()
        for part in list(self._parts.values()):
            blocked = set(part.in_flight)
            for entry in part.entries:
                if len(out) >= batch_size:
                    return out
                if entry.state == "done" or entry.key in blocked:
                    continue
                blocked.add(entry.key)
                if entry.state == "ready" and entry.not_before <= now:
                    message = self._hand_out(part, entry)
                    if message is not None:
                        out.append(message)
            self._commit(part)
        return out

    def _hand_out(self, part: _Partition, entry: _Entry) -> QueueMessage | None:
        record = entry.record
        position = f"{part.topic}:{part.number}:{entry.offset}"
        headers = {k: v for k, v in (record.headers() or [])}
        dedup = headers.get(DEDUP_HEADER)
        window = self._transport.settings.dedup_window
        if dedup is not None and not self._books.claim_dedup(dedup.decode(), position, window):
            entry.state = "done"  # a duplicate of a record already accepted
            return None
        entry.state = "inflight"
        part.in_flight.add(entry.key)
        return QueueMessage(
            body=record.value().decode() if record.value() is not None else "",
            attributes={
                k.removeprefix(ATTR_PREFIX): v.decode()
                for k, v in headers.items()
                if k.startswith(ATTR_PREFIX)
            },
            group_id=record.key().decode() if record.key() is not None else None,
            dedup_id=dedup.decode() if dedup is not None else None,
            receive_count=self._books.incr_attempts(f"{self._group}:{position}"),
            message_id=position,
            native=entry,
        )

    def _commit(self, part: _Partition) -> None:
        while part.entries and part.entries[0].state == "done":
            part.entries.popleft()
        upto = part.entries[0].offset if part.entries else part.next_offset
        if upto <= part.committed:
            return
        try:
            self._consumer.commit(
                offsets=[TopicPartition(part.topic, part.number, upto)], asynchronous=False
            )
            part.committed = upto
        except KafkaException as exc:  # the partition moved away; its next owner redelivers
            logger.warning("commit of %s[%s]@%s failed: %s", part.topic, part.number, upto, exc)

    def _settle(self, message: QueueMessage, state: str, not_before: float = 0.0) -> bool:
        entry: _Entry = message.native
        with self._lock:
            part = entry.owner
            if self._parts.get(part.number) is not part or entry.state != "inflight":
                return False  # revoked, or settled already
            entry.state, entry.not_before = state, not_before
            part.in_flight.discard(entry.key)
            self._lock.notify_all()
            if state == "done":
                self._books.clear_attempts(f"{self._group}:{message.message_id}")
                self._commit(part)
            return True

    def ack(self, message: QueueMessage) -> None:
        self._settle(message, "done")

    def nack(self, message: QueueMessage) -> None:
        self._settle(message, "ready", time.monotonic() + self._transport.settings.retry_backoff)

    def dead_letter(self, message: QueueMessage) -> None:
        """Copy the record to ``<topic><dlq_suffix>`` with an ``ak-error`` header, then commit."""
        record = message.native.record
        headers = [*(record.headers() or []), ("ak-error", b"exceeded max_receive_count")]
        dlq = self._topic + self._transport.settings.dlq_suffix
        self._transport.produce(dlq, record.value() or b"", record.key(), headers)
        self.ack(message)

    def close(self) -> None:
        if not self._closed:
            self._closed = True  # no drain wait on the revocation that close() triggers
            self._consumer.close()


def _bookkeeping(settings: KafkaQueueConfig) -> BookkeepingStore:
    if settings.bookkeeping == "redis":
        return RedisBookkeepingStore(settings.bookkeeping_redis_url, f"ak:{settings.group_id}:")
    logger.warning(
        "Kafka receive counts and dedup are kept in memory: they reset when a worker restarts; "
        "set execution.queues.kafka.bookkeeping: redis to keep them exact"
    )
    return InMemoryBookkeepingStore()
