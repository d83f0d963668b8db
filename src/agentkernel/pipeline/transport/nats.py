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
in one header, because NATS trims spaces from header values.

nats-py is asyncio-only: every call runs on one event-loop thread per server URL, shared by all
transports and consumers of the process (:meth:`NatsTransport.reset` closes them for tests).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import threading
import zlib
from collections import deque
from typing import Any, ClassVar

import nats
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from agentkernel.core.config import NatsQueueConfig, QueuesConfig
from agentkernel.core.errors import (
    AKConfigError,
    MessageRejectedError,
    TransportClosedError,
    TransportError,
)
from agentkernel.pipeline.envelope import QueueMessage, QueueName
from agentkernel.pipeline.event_loop import LoopThread
from agentkernel.pipeline.transport.base import QueueTransport, TransportConsumer

logger = logging.getLogger(__name__)

ENVELOPE_HEADER = "Ak-Envelope"
_ERRORS = (NatsError, asyncio.TimeoutError, TimeoutError, OSError)


def partition_of(group_id: str | None, partitions: int) -> int:
    """The partition a group's messages go to (stable across processes and restarts)."""
    return zlib.crc32((group_id or "").encode()) % partitions


def encode_envelope(message: QueueMessage) -> str:
    doc = {"g": message.group_id, "a": message.attributes}
    return base64.b64encode(json.dumps(doc).encode()).decode()


def decode_envelope(header: str | None) -> tuple[str | None, dict[str, str]]:
    if not header:
        return None, {}
    doc = json.loads(base64.b64decode(header))
    return doc.get("g"), dict(doc.get("a") or {})


class _Connection:
    """One client connection and its private event-loop thread."""

    def __init__(self, url: str, timeout: float) -> None:
        self.loop = LoopThread(f"nats-{url}")
        self.nc: Any = self.loop.run(
            nats.connect(
                url, max_reconnect_attempts=-1, reconnect_time_wait=0.5, connect_timeout=timeout
            ),
            timeout + 5,
        )
        self.js: Any = self.nc.jetstream(timeout=timeout)

    def close(self) -> None:
        with contextlib.suppress(*_ERRORS):
            self.loop.run(self.nc.close(), 5)
        self.loop.stop()


class NatsTransport(QueueTransport):
    """INPUT and OUTPUT on two JetStream work-queue streams.

    Args:
        settings: the ``execution.queues.nats`` block.
        max_deliver: server-side delivery cap per queue (a backstop above max_receive_count).
    """

    _connections: ClassVar[dict[str, _Connection]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, settings: NatsQueueConfig, max_deliver: dict[QueueName, int] | None = None):
        self.settings = settings
        self.max_deliver = max_deliver or {QueueName.INPUT: 4, QueueName.OUTPUT: 4}
        self.streams = {
            QueueName.INPUT: (settings.input_stream, settings.input_subject_prefix),
            QueueName.OUTPUT: (settings.output_stream, settings.output_subject_prefix),
        }
        self.conn = self._connect(settings.url, settings.request_timeout)
        for queue in QueueName:
            self._provision(queue)

    @classmethod
    def from_config(cls, block: QueuesConfig) -> NatsTransport:
        if block.nats is None:
            raise AKConfigError(
                "execution.queues.nats: block is required when execution.queues.type is 'nats'"
            )
        return cls(
            block.nats,
            {
                QueueName.INPUT: block.input.max_receive_count + 1,
                QueueName.OUTPUT: block.output.max_receive_count + 1,
            },
        )

    @classmethod
    def _connect(cls, url: str, timeout: float) -> _Connection:
        with cls._lock:
            conn = cls._connections.get(url)
            if conn is None or conn.nc.is_closed:
                try:
                    conn = cls._connections[url] = _Connection(url, timeout)
                except _ERRORS as exc:
                    raise TransportError(f"cannot connect to NATS at {url}: {exc!r}") from exc
            return conn

    @classmethod
    def reset(cls) -> None:
        """Close every cached connection and its loop thread (tests)."""
        with cls._lock:
            connections, cls._connections = list(cls._connections.values()), {}
        for conn in connections:
            conn.close()

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        """Run a client coroutine on the connection's loop, mapping client errors."""
        try:
            return self.conn.loop.run(coro, timeout or self.settings.request_timeout + 1)
        except NotFoundError:
            raise
        except _ERRORS as exc:
            raise TransportError(f"NATS call failed: {exc!r}") from exc

    # -- provisioning -------------------------------------------------------------------------

    def _provision(self, queue: QueueName) -> None:
        stream, prefix = self.streams[queue]
        s = self.settings
        try:
            self.run(self.conn.js.stream_info(stream))
        except NotFoundError:
            if not s.auto_provision:
                raise AKConfigError(
                    f"execution.queues.nats: stream '{stream}' does not exist on {s.url}; declare "
                    "it (e.g. a NACK Stream resource) or set auto_provision: true for development"
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
        for partition in range(s.partitions):
            self._provision_consumer(queue, partition)

    def _provision_consumer(self, queue: QueueName, partition: int) -> None:
        stream, prefix = self.streams[queue]
        durable = f"{stream}-p{partition}"
        try:
            self.run(self.conn.js.consumer_info(stream, durable))
            return
        except NotFoundError:
            if not self.settings.auto_provision:
                raise AKConfigError(
                    f"execution.queues.nats: consumer '{durable}' of stream '{stream}' does not "
                    "exist; declare it or set auto_provision: true for development"
                ) from None
        config = ConsumerConfig(
            durable_name=durable,
            filter_subject=f"{prefix}.{partition}",
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.settings.ack_wait,
            max_deliver=self.max_deliver[queue],
            max_ack_pending=1,
        )
        self.run(self.conn.js.add_consumer(stream, config))

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
            raise TransportError(f"not connected to NATS at {self.settings.url}")
        self.run(self.conn.nc.flush(self.settings.request_timeout))


class NatsConsumer(TransportConsumer):
    """Pulls from every partition of one stream at once; returns whatever arrives first."""

    def __init__(self, transport: NatsTransport, queue: QueueName) -> None:
        self._transport = transport
        self._stream, _ = transport.streams[queue]
        self._settings = transport.settings
        js = transport.conn.js
        self._subs: list[Any] = [
            transport.run(js.pull_subscribe_bind(f"{self._stream}-p{p}", self._stream))
            for p in range(self._settings.partitions)
        ]
        self._buffer: deque[QueueMessage] = deque()
        self._closed = False

    @property
    def lease_seconds(self) -> float:
        return self._settings.ack_wait

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        if self._closed:
            raise TransportClosedError(f"NATS consumer of {self._stream} is closed")
        if not self._buffer:
            wait = max(wait_seconds, 0.05)
            raw = self._transport.run(self._pull_all(wait), wait + self._settings.request_timeout)
            self._buffer.extend(self._decode(m) for m in raw)
            return self._take(batch_size, refresh=False)
        return self._take(batch_size, refresh=True)

    def _take(self, batch_size: int, refresh: bool) -> list[QueueMessage]:
        out = [self._buffer.popleft() for _ in range(min(batch_size, len(self._buffer)))]
        if refresh:  # buffered since an earlier fetch: restart their ack timers
            for message in out:
                self.extend_lease(message)
        return out

    async def _pull_all(self, wait: float) -> list[Any]:
        tasks = [asyncio.ensure_future(_pull_one(sub, wait)) for sub in self._subs]
        got: list[Any] = []
        try:
            pending: set[asyncio.Future[list[Any]]] = set(tasks)
            while pending and not got:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    got.extend(task.result())
            if pending and got:  # a moment for messages that arrived together
                done, pending = await asyncio.wait(pending, timeout=0.005)
                for task in done:
                    got.extend(task.result())
        finally:
            for task in tasks:
                task.cancel()
        return got

    def _decode(self, msg: Any) -> QueueMessage:
        headers = msg.headers or {}
        group, attributes = decode_envelope(headers.get(ENVELOPE_HEADER))
        meta = msg.metadata
        return QueueMessage(
            body=msg.data.decode(),
            attributes=attributes,
            group_id=group,
            dedup_id=headers.get("Nats-Msg-Id"),
            receive_count=int(meta.num_delivered),
            message_id=f"{self._stream}:{meta.sequence.stream}",
            native=msg,
        )

    def ack(self, message: QueueMessage) -> None:
        self._transport.run(message.native.ack_sync(timeout=self._settings.request_timeout))

    def nack(self, message: QueueMessage) -> None:
        delay = self._settings.retry_backoff or None
        self._transport.run(message.native.nak(delay=delay))

    def dead_letter(self, message: QueueMessage) -> None:
        """Terminate redelivery; the stream's ``max_deliver`` is the server-side backstop."""
        self._transport.run(message.native.term())

    def extend_lease(self, message: QueueMessage) -> None:
        self._transport.run(message.native.in_progress())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for message in self._buffer:  # handed to us but never handed out: give them back now
            with contextlib.suppress(TransportError):
                self._transport.run(message.native.nak())
        self._buffer.clear()
        for sub in self._subs:
            with contextlib.suppress(TransportError, NatsError):
                self._transport.run(sub.unsubscribe())


async def _pull_one(sub: Any, wait: float) -> list[Any]:
    try:
        return list(await sub.fetch(1, timeout=wait))
    except (TimeoutError, NatsTimeoutError):
        return []
