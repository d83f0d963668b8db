"""NATS JetStream: per-session order built from partitions on the client side.

Each queue is a work-queue stream. A message goes to subject ``<prefix>.<partition>`` where the
partition is ``crc32(group_id) % partitions``; each partition has one durable pull consumer with
``max_ack_pending=1``, so at most one message per partition is in flight across every process.
That keeps a session's turns in order and one at a time, and it also means the number of
partitions bounds how many turns the whole deployment runs at once: size it to at least
``runner replicas x turns you want in flight``.

Mapping: ``dedup_id`` -> ``Nats-Msg-Id`` (the stream's ``duplicate_window``), ``receive_count`` ->
``num_delivered``, lease -> ``ack_wait`` (``extend_lease`` sends in-progress), ``nack`` -> ``nak``
with ``retry_backoff``, ``dead_letter`` -> ``term``. Group id and attributes travel base64-encoded
in one header, because NATS trims spaces from header values. The consumers' ``max_deliver`` is
unlimited by default: JetStream counts every delivery, including one a draining consumer gives
back, so a server-side cap could stop a turn before the consumer loop answers it.

nats-py is asyncio-only: every call runs on one event-loop thread per server URL, shared by all
transports and consumers of the process (:meth:`NatsTransport.reset` closes them for tests).
The consumer, which pulls only while a fetch asks, is in :mod:`.consumer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
import zlib
from enum import Enum
from typing import Any, ClassVar

import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from agentkernel.core.config import NatsQueueConfig, QueuesConfig
from agentkernel.core.errors import AKConfigError, MessageRejectedError, TransportError
from agentkernel.core.redact import redact_url
from agentkernel.pipeline.envelope import QueueMessage, QueueName
from agentkernel.pipeline.process.event_loop import LoopThread
from agentkernel.pipeline.transport.base import QueueTransport, require_block
from agentkernel.pipeline.transport.nats.acks import CLIENT_ERRORS
from agentkernel.pipeline.transport.nats.consumer import NatsConsumer
from agentkernel.pipeline.transport.nats.envelope import ENVELOPE_HEADER, encode_envelope

logger = logging.getLogger(__name__)

UNLIMITED = -1
CLIENT_WARNING_INTERVAL_SECONDS = 10.0
#: Consumer settings reconciled on start; the others cannot change under a running pipeline.
UPDATABLE = ("ack_wait", "max_deliver", "max_ack_pending")
FIXED = ("filter_subject", "ack_policy")


def partition_of(group_id: str | None, partitions: int) -> int:
    """The partition a group's messages go to (stable across processes and restarts)."""
    return zlib.crc32((group_id or "").encode()) % partitions


class _Connection:
    """One client connection and its private event-loop thread."""

    def __init__(self, url: str, timeout: float) -> None:
        self.loop = LoopThread(f"nats-{redact_url(url)}")
        try:
            self.nc: Any = self.loop.run(_connect(url, timeout))
        except BaseException:
            self.loop.stop()
            raise
        self.js: Any = self.nc.jetstream(timeout=timeout)

    def close(self) -> None:
        with contextlib.suppress(*CLIENT_ERRORS):
            self.loop.run(self.nc.close(), 5)
        with contextlib.suppress(*CLIENT_ERRORS):
            self.loop.run(_cancel_other_tasks(), 5)
        self.loop.stop()


async def _cancel_other_tasks() -> None:
    """End what consumers left running (inbox drains, give-backs) before the loop stops."""
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _connect(url: str, timeout: float) -> Any:
    connecting = nats.connect(
        url,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=timeout,
        error_cb=_log_client_error,
    )
    return await asyncio.wait_for(connecting, timeout + 5)  # cancelled on this loop, not leaked


_last_client_warning = [0.0]


async def _log_client_error(exc: Exception) -> None:
    """nats-py reports every failed reconnect here: warn at most every 10 s, else debug."""
    now = time.monotonic()
    quiet = now - _last_client_warning[0] < CLIENT_WARNING_INTERVAL_SECONDS
    if not quiet:
        _last_client_warning[0] = now
    level = logging.DEBUG if quiet else logging.WARNING
    logger.log(level, "NATS client error: %s", redact_url(repr(exc)))


class NatsTransport(QueueTransport):
    """INPUT and OUTPUT on two JetStream work-queue streams.

    Args:
        settings: the ``execution.queues.nats`` block.
        max_deliver: server-side delivery cap per queue; default unlimited, so that the consumer
            loop's ``max_receive_count`` decides and its permanent-failure reply is always
            reached. A cap must leave room above ``max_receive_count`` for deliveries a
            draining consumer gives back.

    Raises:
        AKConfigError: a stream or consumer is missing (without ``auto_provision``), an existing
            consumer's settings differ from ``settings``, or the partition count changed.
        TransportError: the server is unreachable.
    """

    _connections: ClassVar[dict[str, _Connection]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, settings: NatsQueueConfig, max_deliver: dict[QueueName, int] | None = None):
        self.settings = settings
        self.max_deliver = max_deliver or {QueueName.INPUT: UNLIMITED, QueueName.OUTPUT: UNLIMITED}
        self.streams = {
            QueueName.INPUT: (settings.input_stream, settings.input_subject_prefix),
            QueueName.OUTPUT: (settings.output_stream, settings.output_subject_prefix),
        }
        self.conn = self._connect(settings.url, settings.request_timeout)
        for queue in QueueName:
            self._provision(queue)

    @classmethod
    def from_config(cls, block: QueuesConfig) -> NatsTransport:
        settings: NatsQueueConfig = require_block(block, "nats")
        return cls(settings)

    @classmethod
    def _connect(cls, url: str, timeout: float) -> _Connection:
        with cls._lock:
            conn = cls._connections.get(url)
            if conn is None or conn.nc.is_closed:
                try:
                    conn = cls._connections[url] = _Connection(url, timeout)
                except CLIENT_ERRORS as exc:
                    raise TransportError(
                        f"cannot connect to NATS at {redact_url(url)}: {redact_url(repr(exc))}"
                    ) from exc
            return conn

    @classmethod
    def reset(cls) -> None:
        """Close every cached connection and its loop thread (tests)."""
        with cls._lock:
            connections, cls._connections = list(cls._connections.values()), {}
        for conn in connections:
            conn.close()

    def run(self, coro: Any, timeout: float | None = None, *, lookup: bool = False) -> Any:
        """Run a client coroutine on the connection's loop, mapping client errors.

        Args:
            lookup: let ``NotFoundError`` through, for provisioning, which creates what is
                missing; anywhere else a missing stream is a :class:`TransportError`.
        """
        try:
            return self.conn.loop.run(coro, timeout or self.settings.request_timeout + 1)
        except CLIENT_ERRORS as exc:
            if lookup and isinstance(exc, NotFoundError):
                raise
            raise TransportError(f"NATS call failed: {redact_url(repr(exc))}") from exc

    # -- provisioning -------------------------------------------------------------------------

    def _provision(self, queue: QueueName) -> None:
        stream, prefix = self.streams[queue]
        s = self.settings
        try:
            self.run(self.conn.js.stream_info(stream), lookup=True)
        except NotFoundError:
            if not s.auto_provision:
                raise AKConfigError(
                    f"execution.queues.nats: stream '{stream}' does not exist on "
                    f"{redact_url(s.url)}; declare it (e.g. a NACK Stream resource) or set "
                    "auto_provision: true for development"
                ) from None
            config = StreamConfig(
                name=stream,
                subjects=[f"{prefix}.>"],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=StorageType.FILE,
                duplicate_window=s.duplicate_window,
                max_age=s.max_age,
            )
            self.run(self.conn.js.add_stream(config))
        self._check_partition_count(stream)
        for partition in range(s.partitions):
            self._provision_consumer(queue, partition)

    def _check_partition_count(self, stream: str) -> None:
        """Refuse to start when the stream's partition consumers were made for another count."""
        pattern = re.compile(rf"{re.escape(stream)}-p(\d+)")
        found = []
        for info in self.run(self.conn.js.consumers_info(stream)):
            if match := pattern.fullmatch(info.name or ""):
                found.append(int(match.group(1)))
        existing = max(found) + 1 if found else 0
        if existing and existing != self.settings.partitions:
            raise AKConfigError(
                f"execution.queues.nats.partitions is {self.settings.partitions} but stream "
                f"'{stream}' has consumers for {existing} partitions; a different count moves "
                "sessions to other partitions and breaks their order. Let the streams drain, "
                "delete the consumers, then start with the new count"
            )

    def _provision_consumer(self, queue: QueueName, partition: int) -> None:
        stream, prefix = self.streams[queue]
        wanted = ConsumerConfig(
            durable_name=f"{stream}-p{partition}",
            filter_subject=f"{prefix}.{partition}",
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.settings.ack_wait,
            max_deliver=self.max_deliver[queue],
            max_ack_pending=1,
        )
        try:
            info = self.run(self.conn.js.consumer_info(stream, wanted.durable_name), lookup=True)
        except NotFoundError:
            if not self.settings.auto_provision:
                raise AKConfigError(
                    f"execution.queues.nats: consumer '{wanted.durable_name}' of stream "
                    f"'{stream}' does not exist; declare it or set auto_provision: true for "
                    "development"
                ) from None
            self.run(self.conn.js.add_consumer(stream, wanted))
            return
        self._reconcile(stream, info.config, wanted)

    def _reconcile(self, stream: str, have: ConsumerConfig, wanted: ConsumerConfig) -> None:
        """Update an existing consumer whose lease or delivery settings changed, or refuse."""
        name = wanted.durable_name
        fixed = _differences(have, wanted, FIXED)
        if fixed:
            raise AKConfigError(
                f"execution.queues.nats: consumer '{name}' of stream '{stream}' has {fixed}; "
                "it cannot be changed in place: delete it (after the stream drained) to recreate"
            )
        changed = _differences(have, wanted, UPDATABLE)
        if not changed:
            return
        if not self.settings.auto_provision:
            raise AKConfigError(
                f"execution.queues.nats: consumer '{name}' of stream '{stream}' has {changed}; "
                "update the declared consumer, or set auto_provision: true to let agentkernel "
                "update it"
            )
        self.run(self.conn.js.add_consumer(stream, wanted))  # JetStream updates these in place
        logger.info("updated NATS consumer %s of %s: %s", name, stream, changed)

    # -- QueueTransport -----------------------------------------------------------------------

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        stream, prefix = self.streams[queue]
        payload = message.body.encode()
        if len(payload) > (limit := self.conn.nc.max_payload):
            raise MessageRejectedError(f"message is {len(payload)} bytes; NATS allows {limit}")
        headers = {ENVELOPE_HEADER: encode_envelope(message)}
        if message.dedup_id:
            headers["Nats-Msg-Id"] = message.dedup_id
        subject = f"{prefix}.{partition_of(message.group_id, self.settings.partitions)}"
        ack = self.run(self.conn.js.publish(subject, payload, headers=headers, stream=stream))
        return None if ack.duplicate else f"{stream}:{ack.seq}"

    def create_consumer(self, queue: QueueName) -> NatsConsumer:
        return NatsConsumer(self, QueueName(queue))

    def check_consumer_capacity(self, queue: QueueName, num_consumers: int) -> None:
        if num_consumers > self.settings.partitions:
            logger.warning(
                "%s consumers on %s but only %s NATS partitions: at most %s messages run at once",
                num_consumers,
                queue,
                self.settings.partitions,
                self.settings.partitions,
            )

    def depth(self, queue: QueueName) -> int:
        """Messages stored in the queue's stream (waiting or in flight)."""
        info = self.run(self.conn.js.stream_info(self.streams[queue][0]))
        return int(info.state.messages)

    def ping(self) -> None:
        if not self.conn.nc.is_connected:
            raise TransportError(f"not connected to NATS at {redact_url(self.settings.url)}")
        self.run(self.conn.nc.flush(self.settings.request_timeout))


def _differences(have: ConsumerConfig, wanted: ConsumerConfig, fields: tuple[str, ...]) -> str:
    """``ack_wait 300.0 (configured: 30.0)``, ... for the fields that differ; '' when none."""
    out = []
    for field in fields:
        current, target = _normal(getattr(have, field)), _normal(getattr(wanted, field))
        if current != target:
            out.append(f"{field} {current} (configured: {target})")
    return ", ".join(out)


def _normal(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if value is None:
        return UNLIMITED  # the server reports an unset cap as absent
    if isinstance(value, float):
        return round(value, 3)
    return value
