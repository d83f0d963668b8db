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
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import re
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from enum import Enum
from typing import Any, ClassVar

import nats
from nats.errors import Error as NatsError
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from agentkernel.core.config import NatsQueueConfig, QueuesConfig
from agentkernel.core.errors import (
    AKConfigError,
    MessageRejectedError,
    TransportClosedError,
    TransportError,
)
from agentkernel.core.redact import redact_url
from agentkernel.pipeline.envelope import QueueMessage, QueueName
from agentkernel.pipeline.event_loop import LoopThread
from agentkernel.pipeline.transport.base import (
    QueueTransport,
    TransportConsumer,
    require_block,
)

logger = logging.getLogger(__name__)

ENVELOPE_HEADER = "Ak-Envelope"
UNLIMITED = -1
#: A no-wait probe not answered within four times the usual answer time (at least this, at most
#: the maximum) targets a partition whose message is in flight elsewhere; its request stays open
#: until the fetch ends.
PROBE_GRACE_SECONDS = 0.005
MAX_PROBE_GRACE_SECONDS = 0.2
INITIAL_ANSWER_SECONDS = 0.01
#: A message received after its fetch returned waits this long for the next fetch, then is
#: given back (at most a third of ``ack_wait``).
HOLD_SECONDS = 2.0
REFRESH_AFTER_SECONDS = 1.0
CLIENT_WARNING_INTERVAL_SECONDS = 10.0
#: Consumer settings reconciled on start; the others cannot change under a running pipeline.
UPDATABLE = ("ack_wait", "max_deliver", "max_ack_pending")
FIXED = ("filter_subject", "ack_policy")
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
        self.loop = LoopThread(f"nats-{redact_url(url)}")
        try:
            self.nc: Any = self.loop.run(_connect(url, timeout))
        except BaseException:
            self.loop.stop()
            raise
        self.js: Any = self.nc.jetstream(timeout=timeout)

    def close(self) -> None:
        with contextlib.suppress(*_ERRORS):
            self.loop.run(self.nc.close(), 5)
        with contextlib.suppress(*_ERRORS):
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
                except _ERRORS as exc:
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

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        """Run a client coroutine on the connection's loop, mapping client errors."""
        try:
            return self.conn.loop.run(coro, timeout or self.settings.request_timeout + 1)
        except NotFoundError:
            raise
        except _ERRORS as exc:
            raise TransportError(f"NATS call failed: {redact_url(repr(exc))}") from exc

    # -- provisioning -------------------------------------------------------------------------

    def _provision(self, queue: QueueName) -> None:
        stream, prefix = self.streams[queue]
        s = self.settings
        try:
            self.run(self.conn.js.stream_info(stream))
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
            info = self.run(self.conn.js.consumer_info(stream, wanted.durable_name))
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


class NatsConsumer(TransportConsumer):
    """Pulls from the partitions only while a fetch asks for messages.

    A fetch for ``n`` messages first probes the partitions ``n`` at a time with no-wait pull
    requests: an empty partition answers "no messages" at once, a partition whose one message is
    in flight elsewhere keeps the request open, so a fetch leases about ``n`` messages, not one
    per partition. When every partition was probed and nothing came, it long-polls the empty
    ones for the rest of the wait. All requests of a fetch reply to one inbox, which is
    unsubscribed when the fetch ends: JetStream then skips the requests still open, without
    counting a delivery. A message that arrived in that last round trip is kept for the next
    fetch (with its lease restarted); if no fetch takes it within a few seconds, or the consumer
    closes, it is given back with ``nak``, which JetStream counts as a delivery.
    """

    def __init__(self, transport: NatsTransport, queue: QueueName) -> None:
        self._transport = transport
        self._stream, _ = transport.streams[queue]
        self._settings = transport.settings
        self._nc = transport.conn.nc
        self._next_subjects = [
            f"$JS.API.CONSUMER.MSG.NEXT.{self._stream}.{self._stream}-p{p}"
            for p in range(self._settings.partitions)
        ]
        self._held: deque[tuple[float, Any]] = deque()  # received, not yet handed out
        self._hold_limit = min(HOLD_SECONDS, self._settings.ack_wait / 3)
        self._retiring: set[asyncio.Task[None]] = set()
        self._release_timer: asyncio.TimerHandle | None = None
        self._changed: asyncio.Event = transport.run(_new_event())
        self._cursor = 0
        self._answer_seconds = INITIAL_ANSWER_SECONDS
        self._closed = False

    @property
    def lease_seconds(self) -> float:
        return self._settings.ack_wait

    @property
    def held(self) -> int:
        """Messages received from the server and not handed out yet (for tests and metrics)."""
        return len(self._held)

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        if self._closed:
            raise TransportClosedError(f"NATS consumer of {self._stream} is closed")
        wait = max(wait_seconds, 0.0)
        arrived = self._transport.run(
            self._fetch(max(batch_size, 1), wait), wait + self._settings.request_timeout
        )
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

    # -- pulling (on the connection's loop) ----------------------------------------------------

    async def _fetch(self, batch: int, wait: float) -> list[tuple[float, Any]]:
        if not self._held and not self._closed:
            await self._pull(batch, wait)
        out: list[tuple[float, Any]] = []
        while self._held and len(out) < batch:
            out.append(self._held.popleft())
        return out

    async def _pull(self, demand: int, wait: float) -> None:
        """Ask the partitions for up to ``demand`` messages, waiting at most ``wait`` seconds."""
        deadline = asyncio.get_running_loop().time() + wait
        pull = _Pull(self._nc.new_inbox(), self._hold, self._changed)
        sub = await self._nc.subscribe(f"{pull.inbox}.*", cb=pull.on_reply)
        try:
            await self._probe(pull, demand)
            if not self._held and pull.idle:
                body = {"batch": 1, "expires": int(wait * 1e9)}
                for partition in sorted(pull.idle):
                    await self._request(pull, partition, body)
                await self._until(lambda: bool(self._held), deadline)
        finally:
            self._retire(sub)

    async def _probe(self, pull: _Pull, demand: int) -> None:
        partitions = len(self._next_subjects)
        order = [(self._cursor + i) % partitions for i in range(partitions)]
        loop = asyncio.get_running_loop()
        while order and not self._held and not self._closed:
            wave, order = order[:demand], order[demand:]
            self._cursor = (wave[-1] + 1) % partitions
            for partition in wave:
                await self._request(pull, partition, {"batch": 1, "no_wait": True})
            done = functools.partial(self._probed, pull, wave, demand)
            await self._until(done, loop.time() + self._probe_grace())
            self._learn(pull.latencies)

    def _probed(self, pull: _Pull, wave: list[int], demand: int) -> bool:
        return pull.answered.issuperset(wave) or len(self._held) >= demand

    def _probe_grace(self) -> float:
        """How long an unanswered probe may take before its partition counts as busy."""
        return min(max(4 * self._answer_seconds, PROBE_GRACE_SECONDS), MAX_PROBE_GRACE_SECONDS)

    def _learn(self, latencies: list[float]) -> None:
        for latency in latencies:  # moving average of how fast the server answers a probe
            self._answer_seconds += (latency - self._answer_seconds) / 8
        latencies.clear()

    async def _request(self, pull: _Pull, partition: int, body: dict[str, Any]) -> None:
        reply = f"{pull.inbox}.{partition}"
        pull.sent[partition] = asyncio.get_running_loop().time()
        await self._nc.publish(self._next_subjects[partition], json.dumps(body).encode(), reply)

    async def _until(self, done: Callable[[], bool], deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while not done() and not self._closed and (left := deadline - loop.time()) > 0:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    def _retire(self, sub: Any) -> None:
        """Cancel a fetch's open requests: unsubscribe, and keep what arrived before that."""
        task = asyncio.ensure_future(self._drain(sub))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _drain(self, sub: Any) -> None:
        try:
            await asyncio.wait_for(sub.drain(), self._settings.request_timeout)
        except (*_ERRORS, asyncio.CancelledError):
            with contextlib.suppress(*_ERRORS):
                await sub.unsubscribe()

    def _hold(self, msg: Any) -> None:
        self._held.append((time.monotonic(), msg))
        if self._closed:
            self._release(lambda _: True)
        elif self._release_timer is None:
            loop = asyncio.get_running_loop()
            self._release_timer = loop.call_later(self._hold_limit, self._release_stale)

    def _release_stale(self) -> None:
        self._release_timer = None
        now = time.monotonic()
        self._release(lambda received_at: now - received_at >= self._hold_limit)
        if self._held:
            due = self._held[0][0] + self._hold_limit - now
            self._release_timer = asyncio.get_running_loop().call_later(due, self._release_stale)

    def _release(self, due: Callable[[float], bool]) -> None:
        """Give back held messages for which ``due(received_at)`` holds (oldest first)."""
        while self._held and due(self._held[0][0]):
            received_at, msg = self._held.popleft()
            if time.monotonic() - received_at < self._settings.ack_wait:  # else redelivered
                logger.debug("giving back %s: no fetch asked for it", _message_id(msg))
                task = asyncio.ensure_future(_nak(msg))
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)

    # -- messages ------------------------------------------------------------------------------

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
        """Terminate redelivery of the message."""
        self._transport.run(message.native.term())

    def extend_lease(self, message: QueueMessage) -> None:
        self._transport.run(message.native.in_progress())

    def close(self) -> None:
        """Stop pulling, then give back what was received and not handed out."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(TransportError):
            self._transport.run(self._shutdown(), self._settings.request_timeout + 5)

    async def _shutdown(self) -> None:
        self._changed.set()  # a fetch still waiting (closed from another thread) ends now
        if self._release_timer is not None:
            self._release_timer.cancel()
        if self._retiring:  # pull inboxes drained: nothing more can arrive
            await asyncio.wait(set(self._retiring), timeout=self._settings.request_timeout)
        self._release(lambda _: True)
        if self._retiring:
            await asyncio.wait(set(self._retiring), timeout=self._settings.request_timeout)


class _Pull:
    """The pull requests of one fetch: they all reply to ``<inbox>.<partition>``."""

    def __init__(self, inbox: str, hold: Callable[[Any], None], changed: asyncio.Event) -> None:
        self.inbox = inbox
        self.answered: set[int] = set()  # partitions that replied (a message or a status)
        self.idle: set[int] = set()  # partitions that had nothing for this request
        self.sent: dict[int, float] = {}  # partition -> when its request went out (loop time)
        self.latencies: list[float] = []  # seconds from request to reply
        self._hold = hold
        self._changed = changed

    async def on_reply(self, msg: Any) -> None:
        status = (msg.headers or {}).get("Status")
        partition = _partition(msg.subject)
        if partition in self.sent and partition not in self.answered:
            self.latencies.append(asyncio.get_running_loop().time() - self.sent[partition])
        self.answered.add(partition)
        if status is None:
            self._hold(msg)
        elif status in ("404", "408"):  # no messages; expired or others are waiting first
            self.idle.add(partition)
        self._changed.set()


def _partition(subject: str) -> int:
    tail = subject.rsplit(".", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _message_id(msg: Any) -> str:
    with contextlib.suppress(Exception):
        return f"{msg.metadata.stream}:{msg.metadata.sequence.stream}"
    return "?"


async def _nak(msg: Any) -> None:
    with contextlib.suppress(*_ERRORS):
        await msg.nak()


async def _new_event() -> asyncio.Event:
    return asyncio.Event()  # created on the loop that will use it
