"""NATS JetStream: per-session order from partitions, each owned by one consumer at a time.

Each queue is a work-queue stream. A message goes to subject ``<prefix>.<partition>`` where the
partition is ``crc32(group_id) % partitions``; each partition has one durable pull consumer
(``max_ack_pending`` from the settings). Each partition is owned by one consumer at a time
(:mod:`.owners`, recorded in the stream ``<stream>_OWNERS``), which alone pulls from it and runs
each session's messages in stream order, one at a time (:mod:`.book`), while the partition's
other sessions run in parallel. So the turns in flight grow with the consumers, and the
partition count bounds how many consumers get work; a new owner holds the sessions a former
owner left unsettled (:mod:`.takeover`).

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
import threading
import zlib
from collections.abc import Coroutine
from typing import Any, ClassVar

from agentkernel.core.config.queues import NatsQueueConfig, QueuesConfig
from agentkernel.core.errors import MessageRejectedError, TransportError
from agentkernel.core.redact import redact_url
from agentkernel.pipeline.runtime.event_loop import LoopThread
from agentkernel.pipeline.transport.base import QueueTransport, require_block
from agentkernel.pipeline.transport.nats.connection import Connection
from agentkernel.pipeline.transport.nats.consumer import NatsConsumer
from agentkernel.pipeline.transport.nats.envelope import ENVELOPE_HEADER, encode_envelope
from agentkernel.pipeline.transport.nats.errors import nats_errors
from agentkernel.pipeline.transport.nats.provision import UNLIMITED, Provisioner
from agentkernel.pipeline.transport.nats.watch import Watch
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

logger = logging.getLogger(__name__)


def partition_of(group_id: str | None, partitions: int) -> int:
    """The partition a group's messages go to (stable across processes and restarts)."""
    return zlib.crc32((group_id or "").encode()) % partitions


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

    _connections: ClassVar[dict[str, Connection]] = {}
    _watches: ClassVar[list[Watch]] = []
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, settings: NatsQueueConfig, max_deliver: dict[QueueName, int] | None = None):
        self.settings = settings
        self.max_deliver = max_deliver or {QueueName.INPUT: UNLIMITED, QueueName.OUTPUT: UNLIMITED}
        self.streams = {
            QueueName.INPUT: (settings.input_stream, settings.input_subject_prefix),
            QueueName.OUTPUT: (settings.output_stream, settings.output_subject_prefix),
        }
        self.conn = self._connect(settings)
        self._provisioner = Provisioner(self)
        for queue in QueueName:
            self._provisioner.ensure_stream(queue)
        self._owned: set[QueueName] = set()
        self._owning = threading.Lock()
        self._units: dict[QueueName, str] = {}  # see stream_unit
        self._watch = Watch(self._fault, f"nats-watch-{settings.input_stream}")
        with self._lock:
            self._watches.append(self._watch)
        self._watch.start()

    @classmethod
    def from_config(cls, block: QueuesConfig) -> NatsTransport:
        return cls(require_block(block, "nats"))

    @classmethod
    def _connect(cls, settings: NatsQueueConfig) -> Connection:
        url = settings.url
        with cls._lock:
            conn = cls._connections.get(url)
            if conn is None or conn.nc.is_closed:
                with nats_errors(f"connect to {redact_url(url)}"):
                    conn = Connection(url, settings.request_timeout, settings.connect_timeout)
                cls._connections[url] = conn
            return conn

    @classmethod
    def reset(cls) -> None:
        """Close every cached connection and its loop thread (tests)."""
        with cls._lock:
            connections, cls._connections = list(cls._connections.values()), {}
            watches, cls._watches = cls._watches, []
        for watch in watches:
            watch.stop()
        for conn in connections:
            conn.close()

    def run(self, coro: Any, timeout: float | None = None, *, lookup: bool = False) -> Any:
        """Run a client coroutine on the connection's loop, mapping client errors.

        Args:
            lookup: let ``NotFoundError`` through, for provisioning, which creates what is
                missing; anywhere else a missing stream is a :class:`TransportError`.
        """
        with nats_errors("call", lookup=lookup):
            return self.conn.loop.run(coro, timeout or self.settings.request_timeout + 1)

    # -- provisioning and ownership -----------------------------------------------------------

    def _own(self, queue: QueueName) -> None:
        """Create or update ``queue``'s consumers once: this process consumes that queue."""
        with self._owning:
            if queue not in self._owned:
                self._provisioner.own(queue)
                self._owned.add(queue)

    def owner_lease(self, queue: QueueName) -> float:
        """Seconds a partition's ownership lasts unrenewed: the owners stream's ``max_age``."""
        return self._provisioner.ensure_owners(queue)

    def _fault(self, queue: QueueName) -> tuple[str, str]:
        """What the watch finds wrong with ``queue`` now: (for sending, for fetching only)."""
        sending = self._provisioner.stream_problem(queue)
        if not sending:  # the stream may have been declared again, here or elsewhere
            with contextlib.suppress(TransportError):
                self._units[queue] = self._read_unit(queue)
        fetching = ""
        if not sending and queue in self._owned:
            fetching = self._provisioner.consumer_problem(queue)
        return sending, fetching

    def fault(self, queue: QueueName) -> str:
        """The last fault found on ``queue`` that refuses its sends ('' when none)."""
        return self._watch.fault(queue)

    def fetch_fault(self, queue: QueueName) -> str:
        """The last fault found on ``queue`` that stops its consumers fetching ('' when none)."""
        return self._watch.fetch_fault(queue)

    def close(self) -> None:
        """Stop checking the streams (the connection is shared: :meth:`reset` closes it)."""
        self._watch.stop()

    # -- QueueTransport -----------------------------------------------------------------------

    async def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        """Await the publish on the connection's loop: at once when called there (as the
        consumer loop's handling is), else by a hop there (the HTTP front's loop)."""
        publish = self._publish(queue, message)
        if asyncio._get_running_loop() is self.conn.loop.loop:
            with nats_errors("call"):
                return self._sent(queue, await publish)
        try:
            future = self.conn.loop.submit(publish)
        except BaseException:
            publish.close()  # the loop is gone: never awaited, and never sent
            raise
        with nats_errors("call"):
            ack = await asyncio.wrap_future(future)  # cancelling this cancels the publish
        return self._sent(queue, ack)

    def home_loop(self) -> LoopThread:
        """The connection's loop thread, where ``send`` publishes without a hop."""
        return self.conn.loop

    def _sent(self, queue: QueueName, ack: Any) -> str | None:
        """What ``send`` returns for the server's publish ack (``None``: a duplicate)."""
        return None if ack.duplicate else f"{self.streams[queue][0]}:{ack.seq}"

    def _publish(self, queue: QueueName, message: QueueMessage) -> Coroutine[Any, Any, Any]:
        """The JetStream publish of ``message``, checked first (raises before any I/O)."""
        if fault := self._watch.fault(queue):
            raise TransportError(fault)
        stream, prefix = self.streams[queue]
        payload = message.body.encode()
        if len(payload) > (limit := self.conn.nc.max_payload):
            raise MessageRejectedError(f"message is {len(payload)} bytes; NATS allows {limit}")
        headers = {ENVELOPE_HEADER: encode_envelope(message)}
        if message.dedup_id:
            headers["Nats-Msg-Id"] = message.dedup_id
        subject = f"{prefix}.{partition_of(message.group_id, self.settings.partitions)}"
        publish: Coroutine[Any, Any, Any] = self.conn.js.publish(
            subject, payload, headers=headers, stream=stream
        )
        return publish

    def create_consumer(self, queue: QueueName) -> NatsConsumer:
        """A consumer of ``queue``; the first one creates or updates the queue's partition
        consumers, which belong to the processes consuming it (see :mod:`.provision`).

        Raises:
            AKConfigError: the partition consumers are missing or differ and may not be changed.
        """
        self._own(QueueName(queue))
        return NatsConsumer(self, QueueName(queue))

    def check_consumer_capacity(self, queue: QueueName, num_consumers: int) -> None:
        if num_consumers > self.settings.partitions:
            logger.warning(
                "%s consumers on %s but only %s NATS partitions: each partition has one owning "
                "consumer, so at most %s of them get work",
                num_consumers,
                queue,
                self.settings.partitions,
                self.settings.partitions,
            )

    def stream_unit(self, queue: QueueName) -> str:
        """The ordering unit of the queue's stream: its name and creation time.

        A stream deleted and declared again numbers its messages from 1 again; its new creation
        time keeps those positions apart from the old ones. Read once, and again at every check
        of the watch (a stream another process declared again). Until then, the store time each
        position carries tells the new stream's messages from the old one's
        (:class:`~agentkernel.pipeline.wire.position.Position`).
        """
        unit = self._units.get(queue)
        if unit is None:
            unit = self._units[queue] = self._read_unit(queue)
        return unit

    def _read_unit(self, queue: QueueName) -> str:
        stream = self.streams[queue][0]
        info = self.run(self.conn.js.stream_info(stream))
        created = info.created.isoformat() if info.created is not None else "?"
        return f"nats:{stream}@{created}"

    def depth(self, queue: QueueName) -> int:
        """Messages stored in the queue's stream (waiting or in flight)."""
        info = self.run(self.conn.js.stream_info(self.streams[queue][0]))
        return int(info.state.messages)

    def ping(self) -> None:
        if not self.conn.nc.is_connected:
            raise TransportError(f"not connected to NATS at {redact_url(self.settings.url)}")
        if fault := self._watch.any_fault():
            raise TransportError(fault)
        self.run(self.conn.nc.flush(self.settings.request_timeout))
