"""The PostgreSQL transport: both queues are rows of one table, leased with ``SKIP LOCKED``.

- **Order and one in flight per session.** Only the head of a group (its lowest id) is handed
  out, and only while it is not leased or delayed, so a session's turns run one at a time in
  order; distinct sessions run in parallel. Sends of one group take an advisory lock first, so
  ids rise in commit order within the group.
- **Leases and exact receive counts.** A fetch leases rows with ``FOR UPDATE SKIP LOCKED`` in
  one statement that also raises ``receive_count`` and sets ``visible_at`` to the end of the
  lease and a fresh ``lease_token``. An ack, nack or lease extension names that token, so one
  made with the handle of an earlier delivery touches nothing. A message whose lease ran out is
  simply visible again.
- **Waking fetchers.** Every send, ack, nack and dead letter sends ``NOTIFY`` on the queue's
  channel; one ``LISTEN`` connection per transport wakes its waiting consumers. A consumer with
  nothing to fetch sleeps until a notification or until the next lease or delay ends (read in
  the same pass), never on a fixed interval.
- **Dedup** by a row per ``(queue, dedup_id)`` kept for ``dedup_window`` seconds, written in
  the send's transaction. **Nack with delay** sets ``visible_at`` ahead. **Dead letters** move to
  ``queue_dead``. **Retention**: a sweeper deletes expired dedup ids, messages older than
  ``max_age`` and dead letters older than ``dead_letter_retention``.
- **Positions** are the row ids, in a unit named by the schema's epoch (a re-created schema
  numbers again).

Tables come from ``agentkernel db migrate`` (:mod:`agentkernel.pipeline.postgres.schema`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import Counter
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from psycopg import sql

from agentkernel.core.config.queues import PostgresQueueConfig, QueuesConfig
from agentkernel.core.errors import TransportClosedError, TransportError
from agentkernel.pipeline.postgres import queue_sql as q
from agentkernel.pipeline.postgres.client import conninfo, open_pool, pg_errors, pooled
from agentkernel.pipeline.postgres.schema import establish, query_in
from agentkernel.pipeline.transport.base import require_block
from agentkernel.pipeline.transport.blocking import BlockingConsumer, BlockingTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from agentkernel.pipeline.wire.position import Position

logger = logging.getLogger(__name__)

KEY = "execution.queues.postgres"
#: Seconds the listener blocks for notifications before it looks at its stop flag.
LISTEN_TICK = 0.5


def _errors(what: str) -> AbstractContextManager[None]:
    return pg_errors(
        what,
        unavailable=TransportError,
        failed=TransportError,
        lost=TransportError,
        full=TransportError,
    )


class PostgresTransport(BlockingTransport):
    """INPUT and OUTPUT as rows of ``<db_schema>.queue_messages``.

    Args:
        config: the ``execution.queues.postgres`` block.

    Raises:
        AKConfigError: the DSN is malformed, or the schema is missing or older and
            ``auto_provision`` is off.
        TransportError: the server could not be reached to check the schema.
    """

    def __init__(self, config: PostgresQueueConfig) -> None:
        self.config = config
        self.names = {QueueName.INPUT: config.input_queue, QueueName.OUTPUT: config.output_queue}
        self.sql = query_in(config.db_schema)
        self.pool = open_pool(config, KEY)
        try:
            with pooled(self.pool, _errors("check of the schema")) as conn:
                self.epoch = establish(conn, config.db_schema, KEY, config.auto_provision)
        except BaseException:
            # A pool left to the garbage collector joins its workers from ``__del__``, in
            # whatever thread collects it; close it here, where the failure is.
            self.pool.close(timeout=2.0)
            raise
        self.wakeups = _Wakeups(conninfo(config, KEY), [self.channel(n) for n in QueueName])
        self._sweeper = threading.Thread(target=self._sweep_forever, name="pg-queue-sweeper")
        self._sweeper.daemon = True
        self._closed = threading.Event()
        self._sweeper.start()

    @classmethod
    def from_config(cls, block: QueuesConfig) -> PostgresTransport:
        """Build from ``execution.queues`` (its ``postgres`` block is required)."""
        return cls(require_block(block, "postgres"))

    def channel(self, queue: QueueName) -> str:
        """The ``NOTIFY`` channel of ``queue``."""
        return f"ak:{self.config.db_schema}:q:{self.names[queue]}"

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        name = self.names[queue]
        args: dict[str, Any] = {
            "queue": name,
            "group": message.group_id,
            "body": message.body,
            "attributes": json.dumps(message.attributes),
            "channel": self.channel(queue),
            "dedup": message.dedup_id,
            "window": self.config.dedup_window,
            "lock": f"{self.config.db_schema}:{name}:{message.group_id}",
        }
        with pooled(self.pool, _errors(f"send to {name}")) as conn, conn.transaction():
            if message.group_id is not None:
                conn.execute(q.GROUP_LOCK, args)
            if message.dedup_id and conn.execute(self.sql(q.DEDUP), args).fetchone() is None:
                logger.debug("dropped duplicate %s on %s", message.dedup_id, name)
                return None
            row = conn.execute(self.sql(q.SEND), args).fetchone()
        return None if row is None else str(row[0])

    def create_consumer(self, queue: QueueName) -> PostgresConsumer:
        return PostgresConsumer(self, queue)

    def ping(self) -> None:
        with pooled(self.pool, _errors("ping")) as conn:
            conn.execute("SELECT 1")

    def sweep(self) -> int:
        """Apply the retention now (the sweeper thread does it every ``sweep_interval``)."""
        args = {"max_age": self.config.max_age, "dead_age": self.config.dead_letter_retention}
        total = 0
        with pooled(self.pool, _errors("sweep of the queues")) as conn:
            for table, condition in q.SWEEPS:
                text = f"DELETE FROM {{s}}.{table} WHERE {condition}"
                total += max(conn.execute(self.sql(text), args).rowcount, 0)
        return total

    def _sweep_forever(self) -> None:
        while not self._closed.wait(self.config.sweep_interval):
            try:
                self.sweep()
            except TransportError as exc:
                logger.warning("%s: sweep failed: %s", KEY, exc)

    def close(self) -> None:
        self._closed.set()
        self.wakeups.stop()
        self.pool.close(timeout=2.0)


class PostgresConsumer(BlockingConsumer):
    """Leases messages of one queue; ack, nack and extend are thread-safe (pooled)."""

    def __init__(self, transport: PostgresTransport, queue: QueueName) -> None:
        self._t, self._queue = transport, queue
        self._name = transport.names[queue]
        self._closed = False
        self._unit = f"postgres:{transport.config.db_schema}.{self._name}@{transport.epoch}"

    @property
    def lease_seconds(self) -> float:
        return self._t.config.ack_wait

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        deadline = time.monotonic() + wait_seconds
        channel = self._t.channel(self._queue)
        while True:
            if self._closed:
                raise TransportClosedError(f"consumer of {self._name} is closed")
            seen = self._t.wakeups.generation(channel)
            got, next_visible = self._claim(batch_size)
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            nap = remaining if next_visible is None else min(remaining, next_visible + 0.01)
            self._t.wakeups.wait(channel, seen, nap)

    def _claim(self, n: int) -> tuple[list[QueueMessage], float | None]:
        token = uuid.uuid4().hex
        args = {"queue": self._name, "n": n, "token": token, "lease": self.lease_seconds}
        with pooled(self._t.pool, _errors(f"fetch from {self._name}")) as conn:
            rows = conn.execute(self._t.sql(q.CLAIM), args).fetchall()
        if rows and rows[0][0] is None:  # nothing leased: when the next lease or delay ends
            ends = rows[0][-1]
            return [], None if ends is None else float(str(ends))
        return [self._message(row[:-1], token) for row in sorted(rows, key=_id)], None

    def _message(self, row: tuple[Any, ...], token: str) -> QueueMessage:
        row_id, group, body, raw, count = row
        attributes, problem = _attributes(str(raw))
        return QueueMessage(
            body=str(body),
            attributes=attributes,
            group_id=group,
            receive_count=int(count),
            message_id=str(row_id),
            position=Position(self._unit, int(row_id)),
            undecodable=problem,
            native=(int(row_id), token),
        )

    def _run(self, what: str, text: str, message: QueueMessage, **more: object) -> None:
        row_id, token = message.native
        args = {"id": row_id, "token": token, "channel": self._t.channel(self._queue)} | more
        with pooled(self._t.pool, _errors(f"{what} of {row_id} on {self._name}")) as conn:
            conn.execute(self._t.sql(text), args)

    def ack(self, message: QueueMessage) -> None:
        self._run("ack", q.ACK, message)

    def nack(self, message: QueueMessage) -> None:
        self._run("nack", q.RELEASE, message, delay=0.0)

    def nack_later(self, message: QueueMessage, delay_seconds: float) -> bool:
        self._run("delayed nack", q.RELEASE, message, delay=max(0.0, delay_seconds))
        return True

    def extend_lease(self, message: QueueMessage) -> None:
        self._run("lease extension", q.EXTEND, message, lease=self.lease_seconds)

    def dead_letter(self, message: QueueMessage) -> None:
        self._run("dead letter", q.DEAD_LETTER, message)

    def close(self) -> None:
        self._closed = True


def _id(row: tuple[Any, ...]) -> int:
    return int(row[0])


def _attributes(raw: str) -> tuple[dict[str, str], str | None]:
    """The attributes of a row, and why they cannot be decoded (``None`` when they can); of
    undecodable ones, the text values are kept (often the request id)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}, "attributes are not JSON"
    if not isinstance(doc, dict):
        return {}, "attributes are not a JSON object"
    text = {k: v for k, v in doc.items() if isinstance(v, str)}
    return text, None if len(text) == len(doc) else "an attribute is not text"


class _Wakeups:
    """One ``LISTEN`` connection per transport, counting the notifications of each channel so
    a consumer can sleep until the count moves past what it saw before its last claim.

    Each notification wakes one waiting consumer of its channel, not all of them: it stands for
    one message that may have become fetchable (a send, an ack or nack that uncovers the next
    message of a session), and with every consumer thread of every process woken, all but one
    claimed nothing (45 claims per turn with 4 runners of 5 threads; benchmarks/README.md). A
    consumer not woken still claims when its wait slice ends, as after a lost notification.
    When the listener (re)connects, every waiting consumer looks again: notifications sent
    while it was down are lost.
    """

    def __init__(self, dsn: str, channels: list[str]) -> None:
        self._dsn, self._channels = dsn, channels
        self._counts = dict.fromkeys(channels, 0)
        self._lock = threading.Lock()
        self._changed = {channel: threading.Condition(self._lock) for channel in channels}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False  # one warning per outage, not one per restart of the listener

    def generation(self, channel: str) -> int:
        """The notification count of ``channel``; starts the listener when it is not running."""
        with self._lock:
            if (
                self._thread is None or not self._thread.is_alive()
            ) and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._listen, name="pg-queue-listener")
                self._thread.daemon = True
                self._thread.start()
            return self._counts[channel]

    def wait(self, channel: str, seen: int, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds unless ``channel`` was notified since ``seen``."""
        changed = self._changed[channel]
        with changed:
            changed.wait_for(lambda: self._counts[channel] != seen, timeout)

    def _listen(self) -> None:
        try:
            with psycopg.connect(self._dsn, autocommit=True) as conn:
                for channel in self._channels:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                self._bump(self._channels, everyone=True)  # anything sent before LISTEN
                if self._failing:
                    logger.warning("%s: queue listener is back", KEY)
                self._failing = False
                while not self._stopping.is_set():
                    for note in conn.notifies(timeout=LISTEN_TICK):  # each as it arrives
                        self._bump([note.channel])
        except psycopg.Error as exc:  # fetches still wake when their wait ends; retried then
            if not self._failing:
                logger.warning("%s: queue listener stopped: %s", KEY, exc)
            self._failing = True
            time.sleep(LISTEN_TICK)

    def _bump(self, channels: list[str], everyone: bool = False) -> None:
        """Count one notification per entry of ``channels``; wake as many waiting consumers of
        each channel (all of them with ``everyone``)."""
        with self._lock:
            for channel, times in Counter(channels).items():
                if channel in self._counts:
                    self._counts[channel] += times
                    if everyone:
                        self._changed[channel].notify_all()
                    else:
                        self._changed[channel].notify(times)

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(LISTEN_TICK * 4)
