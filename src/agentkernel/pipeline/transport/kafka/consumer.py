"""The Kafka consumer: one group member whose private thread owns the client.

See :mod:`agentkernel.pipeline.transport.kafka` for how records are handed out per key, and how
commits and rebalances keep a session's turns from running twice at once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition

from agentkernel.core.config.queues import KafkaQueueConfig
from agentkernel.core.errors import TransportClosedError, TransportError
from agentkernel.pipeline.transport.blocking import BlockingConsumer
from agentkernel.pipeline.transport.bookkeeping import BookkeepingStore
from agentkernel.pipeline.transport.kafka.errors import kafka_errors
from agentkernel.pipeline.transport.kafka.identity import unit_of
from agentkernel.pipeline.transport.kafka.partitions import (
    Entry,
    Partition,
    advance,
    message_of,
    order_key,
    pick,
)
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

logger = logging.getLogger(__name__)

MAX_BUFFERED = 2000
POLL_SECONDS = 0.05  # longest a settled record waits for its commit to be sent
CLOSE_GRACE_SECONDS = 5.0  # leaving the group, on top of commit_timeout
#: A consumer closed while its first group join is still running waits this long for the join to
#: end before it leaves: Tansu never rebalances a group again after a member left mid-join (the
#: next member waits forever), and on any broker it spares the group a second rebalance.
JOIN_SETTLE_SECONDS = 10.0
POLL_ERROR_BACKOFF_SECONDS = 1.0
_CONSUMER_KEY = "execution.queues.kafka (client_config or consumer_config)"


class KafkaSource(Protocol):
    """What a consumer uses of its transport (:class:`~.transport.KafkaTransport`)."""

    settings: KafkaQueueConfig
    topics: dict[QueueName, str]
    bookkeeping: BookkeepingStore
    topic_ids: dict[str, str | None]

    def client_conf(self, **extra: Any) -> dict[str, Any]: ...

    def produce(self, topic: str, value: bytes, key: bytes | None, headers: list[Any]) -> str: ...


class KafkaConsumer(BlockingConsumer):
    """One consumer-group member; hands out records per key (see the module docstring).

    A private thread owns the client: it polls, buffers records, answers rebalances and commits.
    ``fetch`` and the settle methods only touch the buffer, under a lock that is never held
    during a broker call.
    """

    def __init__(self, transport: KafkaSource, queue: QueueName) -> None:
        s = transport.settings
        self._transport = transport
        self._topic = transport.topics[queue]
        self._group = f"{s.group_id}-{queue}"
        self._books = transport.bookkeeping
        self._parts: dict[int, Partition] = {}
        self._lock = threading.Condition()
        self._closed = False
        self._paused = False
        self._stop = threading.Event()
        self._joined = threading.Event()  # the group gave this member an assignment (maybe empty)
        with kafka_errors(f"consumer of {self._topic}", key=_CONSUMER_KEY):
            self._consumer = Consumer(
                transport.client_conf(
                    **{
                        "group.id": self._group,
                        "enable.auto.commit": False,
                        "auto.offset.reset": "earliest",
                        "max.poll.interval.ms": 900000,
                        "session.timeout.ms": 10000,
                        "heartbeat.interval.ms": 1000,
                        "fetch.wait.max.ms": 50,
                        "on_commit": self._on_commit,
                        **s.consumer_config,
                    }
                )
            )
            self._consumer.subscribe(
                [self._topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost
            )
        self._pump = threading.Thread(target=self._run, name=f"kafka-{self._topic}", daemon=True)
        self._pump.start()

    # -- the client thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._poll_once()
                except TransportError as exc:  # the thread outlives a broken broker
                    logger.warning("%s; retrying in %ss", exc, POLL_ERROR_BACKOFF_SECONDS)
                    self._stop.wait(POLL_ERROR_BACKOFF_SECONDS)
                except Exception:
                    logger.exception("Kafka consumer of %s failed; retrying", self._topic)
                    self._stop.wait(POLL_ERROR_BACKOFF_SECONDS)
        finally:
            self._leave()

    def _poll_once(self) -> None:
        self._commit_async(self._due())
        self._throttle()
        with kafka_errors(f"consume from {self._topic}"):
            records = self._consumer.consume(num_messages=500, timeout=POLL_SECONDS)
        self._buffer(records)

    def _leave(self) -> None:
        self._settle_join()
        try:  # commit while still a group member; close() then finds nothing left to commit
            with self._lock:
                numbers = set(self._parts)
            self._commit_confirmed(self._release(numbers, drain=False))
        except Exception:
            logger.exception("final commit on %s failed", self._topic)
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            logger.warning("closing the Kafka consumer of %s failed: %s", self._topic, exc)

    def _settle_join(self) -> None:
        """Let a group join in progress end before leaving (bounded by ``JOIN_SETTLE_SECONDS``).

        What the last polls fetch is dropped: nothing of it is committed, so the partitions' next
        owner reads it.
        """
        deadline = time.monotonic() + JOIN_SETTLE_SECONDS
        while not self._joined.is_set() and time.monotonic() < deadline:
            try:
                self._consumer.consume(num_messages=500, timeout=POLL_SECONDS)
            except (KafkaException, RuntimeError):
                return
        if not self._joined.is_set():
            logger.warning(
                "the Kafka consumer of %s leaves before its group join ended", self._topic
            )

    def _throttle(self) -> None:
        """Pause fetching while the buffer is full; the client keeps answering the group."""
        with self._lock:
            buffered = sum(len(p.entries) for p in self._parts.values())
        if buffered >= MAX_BUFFERED and not self._paused:
            self._consumer.pause(self._consumer.assignment())
            self._paused = True
        elif buffered < MAX_BUFFERED // 2 and self._paused:
            self._consumer.resume(self._consumer.assignment())
            self._paused = False

    def _buffer(self, records: list[Any]) -> None:
        with self._lock:
            for record in records:
                if record.error() is not None:
                    logger.warning("Kafka consumer error on %s: %s", self._topic, record.error())
                    continue
                part = self._parts.get(record.partition())
                if part is None or record.offset() < part.next_offset:
                    continue  # revoked meanwhile, or already buffered
                part.entries.append(Entry(record.offset(), order_key(record), record, part))
                part.next_offset = record.offset() + 1
            if records:
                self._lock.notify_all()

    # -- commits (client thread only) ------------------------------------------------------------

    def _due(self) -> list[tuple[Partition, int]]:
        with self._lock:
            due = [(p, advance(p)) for p in self._parts.values()]
        return [(p, upto) for p, upto in due if upto > p.requested]

    def _commit_async(self, due: list[tuple[Partition, int]]) -> None:
        if not due:
            return
        for part, upto in due:
            part.requested = upto
        offsets = [TopicPartition(p.topic, p.number, upto) for p, upto in due]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            logger.warning("commit on %s failed: %s", self._topic, exc)
            for part, _ in due:
                part.requested = part.committed

    def _on_commit(self, err: Any, offsets: list[Any]) -> None:
        """The broker answered an asynchronous commit (called by the client, in ``consume``)."""
        landed: list[tuple[Partition, int]] = []
        with self._lock:
            for tp in offsets:
                part = self._parts.get(tp.partition)
                if part is None:
                    continue  # handed over; _revoked committed it
                if err is not None or tp.error is not None:
                    reason = err or tp.error
                    logger.warning("commit of %s[%s] failed: %s", tp.topic, tp.partition, reason)
                    part.requested = part.committed  # the next round commits again
                elif tp.offset > part.committed:
                    part.committed = tp.offset
                    landed.append((part, tp.offset))
        self._forget(landed)

    def _commit_confirmed(self, items: list[tuple[Partition, int]]) -> None:
        """Commit and wait (at most ``commit_timeout`` seconds) until the broker has it.

        A synchronous commit may wait forever, so this commits asynchronously and reads the
        committed offsets back.
        """
        if not items:
            return
        wanted = {p.number: upto for p, upto in items}
        deadline = time.monotonic() + self._transport.settings.commit_timeout
        try:
            self._consumer.commit(
                offsets=[TopicPartition(p.topic, p.number, upto) for p, upto in items],
                asynchronous=True,
            )
            while (left := deadline - time.monotonic()) > 0:
                read = self._consumer.committed(
                    [TopicPartition(p.topic, p.number) for p, _ in items], timeout=min(left, 1.0)
                )
                if all(tp.offset >= wanted[tp.partition] for tp in read):
                    self._forget(items)
                    return
                time.sleep(0.02)
        except KafkaException as exc:
            logger.warning("final commit on %s failed: %s", self._topic, exc)
            return
        logger.warning("the broker did not confirm the final commit on %s in time", self._topic)

    def _forget(self, landed: list[tuple[Partition, int]]) -> None:
        for part, committed in landed:
            with self._lock:
                covered = [o for o in part.finished if o < committed]
                part.finished = [o for o in part.finished if o >= committed]
            try:
                self._books.forget(part.books_key, committed, covered)
            except TransportError as exc:  # the keys expire on their own
                logger.warning("bookkeeping of %s not cleared: %s", part.books_key, exc)

    # -- rebalances (client thread, inside consume or close) -------------------------------------

    def _assigned(self, consumer: Any, partitions: list[Any]) -> None:
        self._joined.set()
        if self._stop.is_set():
            return  # leaving: the partitions go back unread (see _settle_join)
        with self._lock:
            for tp in partitions:
                self._parts[tp.partition] = Partition(
                    tp.topic,
                    tp.partition,
                    f"{self._group}:{tp.topic}:{tp.partition}",
                    unit=unit_of(tp.topic, tp.partition, self._transport.topic_ids.get(tp.topic)),
                )

    def _revoked(self, consumer: Any, partitions: list[Any]) -> None:
        """Let the turns in hand on these partitions finish (bounded), commit, hand over."""
        try:
            numbers = {tp.partition for tp in partitions}
            self._commit_confirmed(self._release(numbers, drain=not self._stop.is_set()))
        except Exception:  # an exception here would surface in an unrelated consume()
            logger.exception("giving up partitions of %s failed", self._topic)

    def _lost(self, consumer: Any, partitions: list[Any]) -> None:
        """The group already gave these partitions away: nothing to wait for or commit."""
        self._release({tp.partition for tp in partitions}, drain=False)

    def _release(self, numbers: set[int], drain: bool) -> list[tuple[Partition, int]]:
        timeout = self._transport.settings.rebalance_drain_timeout if drain else 0.0
        deadline = time.monotonic() + timeout
        with self._lock:
            moving = [p for n, p in self._parts.items() if n in numbers]
            for part in moving:
                part.revoking = True  # hand out nothing more from here
            while any(p.in_flight for p in moving) and (left := deadline - time.monotonic()) > 0:
                self._lock.wait(left)  # releases the lock, so acks go through
            for part in moving:
                del self._parts[part.number]  # the next owner starts at the committed offset
                if part.in_flight:
                    logger.warning(
                        "giving up %s with %s records running: the next owner runs them again",
                        part.books_key,
                        len(part.in_flight),
                    )
            due = [(p, advance(p)) for p in moving]
        return [(p, upto) for p, upto in due if upto > p.committed]

    # -- the TransportConsumer side (any thread) -------------------------------------------------

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        deadline = time.monotonic() + wait_seconds
        while True:
            with self._lock:
                if self._closed:
                    raise TransportClosedError(f"Kafka consumer of {self._topic} is closed")
                picked = pick(self._parts.values(), batch_size, time.monotonic())
                remaining = deadline - time.monotonic()
                if not picked and remaining > 0:
                    self._lock.wait(min(remaining, 0.1))  # records, acks, or a backoff ending
                    continue
            out = self._deliver(picked)
            if out or remaining <= 0:
                return out

    def _deliver(self, picked: list[Entry]) -> list[QueueMessage]:
        """Turn picked entries into messages; skip duplicates and records already finished."""
        out: list[QueueMessage] = []
        for i, entry in enumerate(picked):
            try:
                message = message_of(entry, self._books, self._transport.settings.dedup_window)
            except TransportError:
                for rest in picked[i:]:
                    self._settle_entry(rest, "ready")
                if out:
                    logger.warning("bookkeeping failed; handing out %s records", len(out))
                    return out
                raise
            if message is None:
                self._settle_entry(entry, "done")
            else:
                out.append(message)
        return out

    def _settle_entry(self, entry: Entry, state: str, not_before: float = 0.0) -> bool:
        """Record an outcome; the client thread commits it within one poll (no I/O here)."""
        part = entry.owner
        with self._lock:
            if self._parts.get(part.number) is not part or entry.state != "inflight":
                return False  # revoked, or settled already
            entry.state, entry.not_before = state, not_before
            part.in_flight.discard(entry.key)
            if state == "done":
                part.finished.append(entry.offset)
            self._lock.notify_all()
            return True

    def ack(self, message: QueueMessage) -> None:
        entry: Entry = message.native
        if entry.state == "inflight":
            try:  # so the partition's next owner skips it even if no commit covers it yet
                self._books.finish(entry.owner.books_key, entry.offset)
            except TransportError as exc:
                logger.warning("%s not marked finished: %s", message.message_id, exc)
        self._settle_entry(entry, "done")

    def nack(self, message: QueueMessage) -> None:
        self.nack_later(message, self._transport.settings.retry_backoff)

    def nack_later(self, message: QueueMessage, delay_seconds: float) -> bool:
        """Serve the record again (first of its session) once the delay has passed."""
        self._settle_entry(message.native, "ready", time.monotonic() + delay_seconds)
        return True

    def dead_letter(self, message: QueueMessage) -> None:
        """Copy the record to ``<topic><dlq_suffix>`` with an ``ak-error`` header, then commit."""
        record = message.native.record
        reason = message.undecodable or "exceeded max_receive_count"
        headers = [*(record.headers() or []), ("ak-error", reason.encode())]
        dlq = self._topic + self._transport.settings.dlq_suffix
        self._transport.produce(dlq, record.value() or b"", record.key(), headers)
        self.ack(message)

    def close(self) -> None:
        """Stop the client thread: commit what is finished and leave the group (bounded)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
        self._stop.set()
        limit = self._transport.settings.commit_timeout + CLOSE_GRACE_SECONDS
        if not self._joined.is_set():
            limit += JOIN_SETTLE_SECONDS
        self._pump.join(limit)
        if self._pump.is_alive():
            logger.warning("the Kafka consumer of %s did not close in %ss", self._topic, limit)
