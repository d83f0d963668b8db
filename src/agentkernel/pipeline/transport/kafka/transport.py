"""The Kafka transport: topics, sending, and the bookkeeping store its consumers share.

See :mod:`agentkernel.pipeline.transport.kafka` for the design; the consumer is in
:mod:`.consumer`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Container
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from agentkernel.core.config.kafka import require_shared
from agentkernel.core.config.queues import KafkaQueueConfig, QueuesConfig
from agentkernel.core.errors import AKConfigError, MessageRejectedError, TransportError
from agentkernel.pipeline.transport.base import require_block
from agentkernel.pipeline.transport.blocking import BlockingTransport
from agentkernel.pipeline.transport.bookkeeping import (
    BookkeepingStore,
    InMemoryBookkeepingStore,
    RedisBookkeepingStore,
)
from agentkernel.pipeline.transport.kafka.consumer import KafkaConsumer
from agentkernel.pipeline.transport.kafka.errors import error_code, kafka_errors
from agentkernel.pipeline.transport.kafka.identity import (
    bookkeeping_prefix,
    cluster_id,
    topic_ids,
)
from agentkernel.pipeline.transport.kafka.partitions import ATTR_PREFIX, DEDUP_HEADER
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1_000_000
_CLIENT_KEY = "execution.queues.kafka.client_config"
_LIBRDKAFKA_LOG = logging.getLogger("agentkernel.kafka.librdkafka")


class KafkaTransport(BlockingTransport):
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
        self._producer: Any = None
        self._lock = threading.Lock()
        with kafka_errors("admin client", key=_CLIENT_KEY):
            self._admin = AdminClient(self.client_conf())
        if bookkeeping is None:
            require_shared(settings)  # a configuration error, before any connection
        metadata = self._metadata()  # one round trip: unreachable fails here, once
        self._owns_bookkeeping = bookkeeping is None
        if bookkeeping is None:
            bookkeeping = _bookkeeping(settings, cluster_id(metadata))
        self.bookkeeping = bookkeeping
        self._check_topics(metadata.topics)
        #: Topic name -> the broker's topic id (``None``: not reported), naming positions.
        self.topic_ids = topic_ids(
            self._admin, list(self.topics.values()), settings.metadata_timeout
        )

    @classmethod
    def from_config(cls, block: QueuesConfig) -> KafkaTransport:
        return cls(require_block(block, "kafka"))

    def client_conf(self, **extra: Any) -> dict[str, Any]:
        """The librdkafka settings of a client: ours, then ``extra``, then ``client_config``."""
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
        with kafka_errors(f"metadata from {self.settings.bootstrap_servers}"):
            return self._admin.list_topics(timeout=self.settings.metadata_timeout)

    def _check_topics(self, existing: Container[str]) -> None:
        missing = [t for t in self._all_topics() if t not in existing]
        if not missing:
            return
        if not self.settings.auto_provision:
            raise AKConfigError(
                f"execution.queues.kafka: topic(s) {', '.join(missing)} do not exist; create them "
                "(e.g. Strimzi KafkaTopic resources) or set auto_provision: true for development"
            )
        with kafka_errors(f"creation of topic(s) {', '.join(missing)}"):
            futures = self._admin.create_topics(
                [
                    NewTopic(t, num_partitions=self.settings.partitions, replication_factor=1)
                    for t in missing
                ]
            )
            for future in futures.values():
                _created(future, self.settings.metadata_timeout)
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
                with kafka_errors("producer", key=_CLIENT_KEY):
                    self._producer = Producer(
                        self.client_conf(
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
        fields = {"value": value, "key": key, "headers": headers, "on_delivery": delivered}
        with kafka_errors(f"produce to {topic}"):
            try:
                producer.produce(topic, **fields)
            except BufferError:  # the client's queue is full: let it deliver some, then again
                producer.poll(1.0)
                try:
                    producer.produce(topic, **fields)
                except BufferError as exc:
                    raise TransportError(f"Kafka produce to {topic}: queue full") from exc
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
        if self._owns_bookkeeping:
            self.bookkeeping.close()


def _created(future: Any, timeout: float) -> None:
    """Wait for one topic creation; a topic another process created meanwhile is fine."""
    try:
        future.result(timeout)
    except KafkaException as exc:
        if error_code(exc) != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def _bookkeeping(settings: KafkaQueueConfig, cluster: str | None) -> BookkeepingStore:
    """The bookkeeping of ``settings`` (already checked by :func:`require_shared`)."""
    if settings.bookkeeping != "in_memory":
        prefix = bookkeeping_prefix(cluster, settings.group_id, settings.bootstrap_servers)
        return RedisBookkeepingStore(settings.bookkeeping_redis_url, prefix)
    logger.warning(
        "Kafka receive counts and dedup are kept in memory: they reset when a worker restarts; "
        "set execution.queues.kafka.bookkeeping: redis to keep them exact"
    )
    return InMemoryBookkeepingStore()
