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
import time
import zlib
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
from agentkernel.pipeline.transport.base import (
    QueueTransport,
    TransportConsumer,
    require_block,
)

logger = logging.getLogger(__name__)

ENVELOPE_HEADER = "Ak-Envelope"
PULL_EXPIRY_SECONDS = 5.0
REFRESH_AFTER_SECONDS = 1.0
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
        settings: NatsQueueConfig = require_block(block, "nats")
        return cls(
            settings,
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
    """Keeps one pull request open per partition and hands out whatever arrives.

    A pull task per partition runs on the connection's loop and feeds a local queue, so a fetch
    costs no round trip and a message reaches the consumer as soon as the server releases it.
    With ``max_ack_pending=1`` at most one message per partition waits in that queue. A message
    that waited there a while gets its lease restarted when handed out; one that waited longer
    than ``ack_wait`` has been redelivered by the server already and is dropped.
    """

    def __init__(self, transport: NatsTransport, queue: QueueName) -> None:
        self._transport = transport
        self._stream, _ = transport.streams[queue]
        self._settings = transport.settings
        js = transport.conn.js
        self._subs: list[Any] = [
            transport.run(js.pull_subscribe_bind(f"{self._stream}-p{p}", self._stream))
            for p in range(self._settings.partitions)
        ]
        self._arrivals: asyncio.Queue[tuple[float, Any]] = transport.run(_new_queue())
        self._pullers: list[asyncio.Task[None]] = transport.run(self._start_pullers())
        self._closed = False

    async def _start_pullers(self) -> list[asyncio.Task[None]]:
        return [asyncio.ensure_future(self._pull_forever(sub)) for sub in self._subs]

    async def _pull_forever(self, sub: Any) -> None:
        while True:
            try:
                for msg in await sub.fetch(1, timeout=PULL_EXPIRY_SECONDS):
                    self._arrivals.put_nowait((time.monotonic(), msg))
            except (TimeoutError, NatsTimeoutError):
                continue
            except NatsError:  # disconnected or reconnecting: try again shortly
                await asyncio.sleep(0.5)

    @property
    def lease_seconds(self) -> float:
        return self._settings.ack_wait

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        if self._closed:
            raise TransportClosedError(f"NATS consumer of {self._stream} is closed")
        wait = max(wait_seconds, 0.0)
        arrived = self._transport.run(self._next(batch_size, wait), wait + 5)
        now, out = time.monotonic(), []
        for received_at, msg in arrived:
            age = now - received_at
            if age >= self._settings.ack_wait:
                continue  # its lease ran out while it waited here: the server redelivered it
            message = self._decode(msg)
            if age > REFRESH_AFTER_SECONDS:
                self.extend_lease(message)
            out.append(message)
        return out

    async def _next(self, batch_size: int, wait: float) -> list[tuple[float, Any]]:
        try:
            first = await asyncio.wait_for(self._arrivals.get(), wait) if wait else None
        except TimeoutError:
            return []
        out = [] if first is None else [first]
        while len(out) < batch_size and not self._arrivals.empty():
            out.append(self._arrivals.get_nowait())
        return out

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
        with contextlib.suppress(TransportError):
            self._transport.run(self._stop_pullers())
        for sub in self._subs:
            with contextlib.suppress(TransportError, NatsError):
                self._transport.run(sub.unsubscribe())

    async def _stop_pullers(self) -> None:
        for task in self._pullers:
            task.cancel()
        await asyncio.gather(*self._pullers, return_exceptions=True)
        while not self._arrivals.empty():  # received but never handed out: give them back now
            _, msg = self._arrivals.get_nowait()
            with contextlib.suppress(*_ERRORS):
                await msg.nak()


async def _new_queue() -> asyncio.Queue[tuple[float, Any]]:
    return asyncio.Queue()  # created on the loop that will use it
