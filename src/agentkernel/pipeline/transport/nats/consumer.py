"""The NATS JetStream consumer: owns some partitions and runs each session one turn at a time.

See :mod:`agentkernel.pipeline.transport.nats` for the stream and partition layout,
:mod:`.owners` for how partitions are shared out between consumers and fenced, and :mod:`.book`
for the per-session order inside an owned partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from nats.js.errors import NotFoundError

from agentkernel.core.config.queues import NatsQueueConfig
from agentkernel.core.errors import TransportClosedError, TransportError
from agentkernel.pipeline.runtime.event_loop import LoopThread
from agentkernel.pipeline.transport.nats.acks import (
    Acks,
    in_progress_quietly,
    message_id,
    nak_quietly,
)
from agentkernel.pipeline.transport.nats.book import Book, Entry
from agentkernel.pipeline.transport.nats.changes import Changes
from agentkernel.pipeline.transport.nats.connection import Connection
from agentkernel.pipeline.transport.nats.envelope import received_message
from agentkernel.pipeline.transport.nats.errors import CLIENT_ERRORS
from agentkernel.pipeline.transport.nats.owners import Owners
from agentkernel.pipeline.transport.nats.pull import PULL_SECONDS, Inbox, Pulling
from agentkernel.pipeline.transport.nats.settle import Settling, on_home
from agentkernel.pipeline.transport.nats.takeover import take_over
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

logger = logging.getLogger(__name__)

#: Messages received and not handed out above which no partition is asked for more.
MAX_WAITING = 1024
#: How often open requests, waiting leases and stuck heads are looked after.
HOUSEKEEPING_SECONDS = 0.1
STUCK_CHECK_SECONDS = 0.25
REFRESH_AFTER_SECONDS = 1.0
#: A fetch that found nothing waits up to this long past its wait for the answers of the pulls
#: it sent. The server may answer a pull after a short wait has ended (its consumer handles the
#: request apart from the stream's writes, late on a busy machine), and what such an answer
#: brings would arrive unasked: given back at close, each one a delivery more.
ANSWER_GRACE_SECONDS = 0.5


class NatsSource(Protocol):
    """What a consumer uses of its transport (:class:`~.transport.NatsTransport`)."""

    settings: NatsQueueConfig
    #: Queue -> (stream name, subject prefix).
    streams: dict[QueueName, tuple[str, str]]
    conn: Connection

    def run(self, coro: Any, timeout: float | None = None, *, lookup: bool = False) -> Any: ...

    def stream_unit(self, queue: QueueName) -> str: ...

    def owner_lease(self, queue: QueueName) -> float: ...

    def fetch_fault(self, queue: QueueName) -> str: ...


class NatsConsumer(Pulling, Settling):
    """Owns a share of the partitions (see :mod:`.owners`) and pulls only from those.

    Each owned partition has one long poll open; what arrives is kept in the partition's
    :class:`~.book.Book` and handed out per session in stream order, one message of a session
    at a time. A message waiting behind its session's running turn keeps its lease alive with
    in-progress acks. ``ack`` settles the message at once (its session's next message may be
    handed out) and sends the acknowledgement, confirmed in the background (see :mod:`.acks`).
    """

    def __init__(self, transport: NatsSource, queue: QueueName) -> None:
        self._transport = transport
        self._queue = queue
        self._stream, self._prefix = transport.streams[queue]
        transport.stream_unit(queue)  # names positions (see pipeline.position); read it now
        self._settings = transport.settings
        self._nc = transport.conn.nc
        self._js = transport.conn.js
        self._home = transport.conn.loop
        self._loop = self._home.loop  # a reset transport's loop is closed, not renewed
        self._books: dict[int, Book] = {}
        self._late: list[Entry] = []  # handed to the drain after fetching stopped
        self._drained: dict[int, Book] = {}  # handed back while draining: run out by the drain
        self._inbox: Inbox | None = None
        self._old_inboxes: list[tuple[float, Any]] = []  # (unsubscribe at, subscription)
        self._retiring: set[asyncio.Task[None]] = set()
        self._changed = Changes(self._loop)
        self._cursor = 0
        self._wanted, self._wanted_until = 1, 0.0  # the waiting fetch's demand and deadline
        self._fetching_stopped = False
        self._closed = False
        self._acks = Acks(self._settings, self._nc, self._retiring, lambda: self._closed)
        self._owners = Owners(
            self._js,
            self._stream,
            self._settings.partitions,
            transport.owner_lease(queue),
            self._gained,
            self._lost,
            self._busy,
        )
        self._housekeeping: asyncio.Task[None] | None = None
        transport.run(self._start(), self._settings.request_timeout * 4)

    @property
    def lease_seconds(self) -> float:
        return self._settings.ack_wait

    @property
    def held(self) -> int:
        """Messages received and not handed out (for tests and metrics)."""
        return int(self._transport.run(self._count_waiting()))

    async def _count_waiting(self) -> int:  # on the loop, where the books change
        return self._waiting()

    def _waiting(self) -> int:
        return sum(1 for book in self._books.values() for _ in book.waiting())

    def _room_to_pull(self) -> bool:
        """Fewer than ``MAX_WAITING`` messages wait here (counted only when the entries, which
        include those handed out, are that many: a fetch asks this every time)."""
        entries = sum(len(book.entries) for book in self._books.values())
        return entries < MAX_WAITING or self._waiting() < MAX_WAITING

    @property
    def owned(self) -> list[int]:
        """The partitions this consumer believes it owns now (for tests and metrics)."""
        now = self._loop.time()
        return sorted(p for p, claim in list(self._owners.claims.items()) if now < claim.until)

    async def _start(self) -> None:
        await self._open_inbox()
        await self._owners.start()
        self._housekeeping = asyncio.ensure_future(self._keep_house())

    # -- ownership (on the connection's loop) ---------------------------------------------------

    async def _gained(self, partition: int) -> None:
        """Take a partition over (see :mod:`.takeover`), then pull from it."""
        subject = f"{self._prefix}.{partition}"
        book = await take_over(self._js, self._stream, subject, partition, self._loop.time())
        self._books[partition] = book
        if book.entries:
            logger.info(
                "%s: took partition %s over with %s messages pending from its former owner",
                self._stream,
                partition,
                len(book.entries),
            )
        if self._wanted_until > self._loop.time():
            self._pull(partition)

    async def _lost(self, partition: int, handing_back: bool) -> None:
        """Stop using a partition: let its long poll end, then give back what waits here."""
        if handing_back and self._inbox is not None:
            request = self._inbox.open.get(partition)
            while request is not None and self._inbox.open.get(partition) is request:
                if self._loop.time() > request.due + 1.0:
                    break
                await asyncio.sleep(0.02)
        book = self._books.pop(partition, None)
        if book is None:
            return
        if self._fetching_stopped and not self._closed:  # the drain runs what it can
            self._late += book.take(book.runnable, self._loop.time())
            self._drained[partition] = book  # the rest as their turns before them settle
            self._changed.set()
            return
        for entry in list(book.waiting()):
            logger.info(
                "giving back %s: partition %s changes owner", message_id(entry.msg), partition
            )
            await nak_quietly(entry.msg)
        self._changed.set()

    async def _keep_house(self) -> None:
        last_stuck_check = 0.0
        while not self._closed:
            await asyncio.sleep(HOUSEKEEPING_SECONDS)
            try:
                now = self._loop.time()
                await self._tend_inboxes(now)
                if self._wanted_until > now and self._room_to_pull():
                    self._pull_idle()
                await self._owners.expire(now)  # also when renewals stall
                self._keep_leases(now)
                if now - last_stuck_check >= STUCK_CHECK_SECONDS:
                    last_stuck_check = now
                    await self._check_stuck()
            except CLIENT_ERRORS as exc:
                logger.debug("%s: housekeeping: %r", self._stream, exc)
            except Exception:
                logger.exception("%s: housekeeping failed", self._stream)

    def _keep_leases(self, now: float) -> None:
        """Restart the lease of each message waiting here longer than a third of it."""
        every = self._settings.ack_wait / 3
        for book in [*self._books.values(), *self._drained.values()]:
            for entry in book.waiting():
                if now - entry.touched >= every:
                    entry.touched = now
                    self._spawn(in_progress_quietly(entry.msg))

    async def _check_stuck(self) -> None:
        """Forget heads that hold their session back and are gone from the stream (settled by
        a former owner, or terminated)."""
        for book in list(self._books.values()):
            for entry in book.stuck():
                try:
                    await self._js.get_msg(self._stream, seq=entry.seq)
                except NotFoundError:
                    book.remove(entry.seq)
                    self._changed.set()

    # -- fetching ---------------------------------------------------------------------------------

    def home_loop(self) -> LoopThread:
        """The connection's loop thread: fetch and settle there without a thread hop."""
        return self._home

    @on_home
    async def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        self._check_open()  # a reset transport's loop runs nothing more
        wait = max(wait_seconds, 0.0)
        if self._transport.fetch_fault(self._queue):  # the streams changed under us: take nothing
            await asyncio.sleep(min(wait, 1.0))
            return []
        entries = await self._fetch(max(batch_size, 1), wait)
        return [self._decode(entry.msg) for entry in entries]

    async def _fetch(self, batch: int, wait: float) -> list[Entry]:
        deadline = self._loop.time() + wait
        asked = False  # a fetch that does not wait still asks each partition once
        try:
            while True:
                out = self._take(batch)
                if out or self._closed or self._fetching_stopped:
                    return out
                left = deadline - self._loop.time()
                if left > 0 or not asked:
                    self._wanted, self._wanted_until = batch, deadline
                    if self._room_to_pull():  # else: hand those out first
                        self._pull_idle()
                    asked = True
                if left <= 0:  # past the wait: only for the answers of the pulls still open
                    left = deadline + ANSWER_GRACE_SECONDS - self._loop.time()
                    if left <= 0 or self._inbox is None or not self._inbox.open:
                        return out
                self._changed.clear()
                await self._changed.wait(left)
        finally:
            self._wanted_until = 0.0

    def _take(self, limit: int) -> list[Entry]:
        """Runnable heads of the owned partitions, taking turns between partitions."""
        out: list[Entry] = []
        ready = [p for p, book in self._books.items() if book.runnable]
        if not ready:
            return out
        partitions, cursor = self._settings.partitions, self._cursor
        ready.sort(key=lambda p: (p - cursor) % partitions)  # from the cursor on, wrapping
        now = self._loop.time()
        for partition in ready:
            if len(out) >= limit:
                break
            if not self._owners.owns(partition, now):
                continue
            out += self._books[partition].take(limit - len(out), now)
            self._cursor = (partition + 1) % partitions
        for entry in out:
            if now - entry.touched > REFRESH_AFTER_SECONDS:  # waited: restart its lease
                entry.touched = now
                self._spawn(in_progress_quietly(entry.msg))
        return out

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosedError(f"NATS consumer of {self._stream} is closed")

    def _decode(self, msg: Any) -> QueueMessage:
        return received_message(msg, self._stream, self._transport.stream_unit(self._queue))

    # -- stopping ---------------------------------------------------------------------------------

    @on_home
    async def stop_fetching(self) -> list[QueueMessage]:
        """Hand the partitions back now; returns the messages that were delivered here, not
        handed out and first in their session, for the drain to run (given back, each would
        cost a delivery). Called again during the drain, returns those whose turn before them
        has been settled since; what is left at ``close`` is given back. The partitions' new
        owners hold those sessions until then (see :mod:`.takeover`)."""
        with contextlib.suppress(TransportError, TimeoutError):
            async with asyncio.timeout(PULL_SECONDS * 4 + 5):
                entries = await self._stop_fetching()
            return [self._decode(entry.msg) for entry in entries]
        return []

    async def _stop_fetching(self) -> list[Entry]:
        now = self._loop.time()
        if not self._fetching_stopped:
            self._fetching_stopped = True
            for book in self._books.values():
                self._late += book.take(book.runnable, now)
            await self._owners.stop()
        for book in self._drained.values():
            self._late += book.take(book.runnable, now)
        late, self._late = self._late, []
        return late

    async def close(self) -> None:
        """Hand the partitions back, giving back what was received and not handed out."""
        if self._closed:
            return
        with contextlib.suppress(TransportError, TimeoutError, RuntimeError):
            await self._closing()
        self._closed = True

    @on_home
    async def _closing(self) -> None:
        async with asyncio.timeout(PULL_SECONDS * 4 + 10):
            await self._shutdown()

    async def _shutdown(self) -> None:
        self._fetching_stopped = True
        self._late = []
        self._changed.set()  # a fetch still waiting (closed from another thread) ends now
        self._closed = True
        await self._owners.stop()
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        for book in self._drained.values():  # the drain did not get to them
            for entry in list(book.waiting()):
                logger.info("giving back %s: the drain ended first", message_id(entry.msg))
                await nak_quietly(entry.msg)
        self._drained = {}
        if self._acks.pending:
            await asyncio.wait(set(self._acks.pending), timeout=self._settings.request_timeout)
        if self._inbox is not None:
            self._retire(self._inbox.sub)
        for _, sub in self._old_inboxes:
            self._retire(sub)
        self._old_inboxes = []
        if self._retiring:
            await asyncio.wait(set(self._retiring), timeout=self._settings.request_timeout)
        with contextlib.suppress(*CLIENT_ERRORS):  # the naks reach the server before we return
            await self._nc.flush(self._settings.request_timeout)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
