"""Settling what a NATS consumer handed out: ack, nak, terminate, extend, per delivery.

Each settles the delivery's entry in its partition's book (see :mod:`.book`) as well as on the
server: an ack or a termination frees the session's next message, a nak keeps the session
waiting for the redelivery. A stale handle (a newer delivery of the message is current here)
changes nothing.

They run on the connection's loop (awaited elsewhere, they hop there first). An ack settles the
book at once and its confirmation comes in the background (see :mod:`.acks`); a nak, a
termination or an extension waits for the server, and a failure of one is logged, not raised:
the message's lease then runs out and it comes again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from agentkernel.core.config.queues import NatsQueueConfig
from agentkernel.core.errors import TransportClosedError
from agentkernel.pipeline.runtime.event_loop import LoopThread
from agentkernel.pipeline.transport.base import TransportConsumer
from agentkernel.pipeline.transport.nats.acks import Acks, message_id
from agentkernel.pipeline.transport.nats.book import REMOTE, Book, Entry
from agentkernel.pipeline.transport.nats.changes import Changes
from agentkernel.pipeline.transport.nats.pull import partition_of_reply
from agentkernel.pipeline.wire.envelope import QueueMessage

logger = logging.getLogger(__name__)


T = TypeVar("T")


def on_home(
    method: Callable[..., Coroutine[Any, Any, T]],
) -> Callable[..., Coroutine[Any, Any, T]]:
    """Run a consumer coroutine on the connection's loop: at once when awaited there (the
    consumer loop does), else by a hop there (a test, a caller's own loop)."""

    @functools.wraps(method)
    async def run(self: Settling, *args: Any) -> T:
        if asyncio._get_running_loop() is self._loop:
            return await method(self, *args)
        coro = method(self, *args)
        try:
            future = self._home.submit(coro)
        except RuntimeError as exc:  # a reset transport's loop is closed, not renewed
            coro.close()
            raise TransportClosedError(f"NATS connection of {self._stream} is closed") from exc
        return await asyncio.wrap_future(future)

    return run


class Settling(TransportConsumer):
    """The settle methods of :class:`~.consumer.NatsConsumer` (their state is set up there)."""

    _stream: str
    _settings: NatsQueueConfig
    _nc: Any
    _home: LoopThread
    _loop: asyncio.AbstractEventLoop
    _books: dict[int, Book]
    _drained: dict[int, Book]
    _changed: Changes
    _acks: Acks

    def _entry(self, msg: Any) -> tuple[Book | None, Entry | None, bool]:
        """The book and entry of a handed-out delivery, and whether its handle is stale (a
        newer delivery of the message is current here)."""
        partition = partition_of_reply(msg.subject)
        book = self._books.get(partition) or self._drained.get(partition)
        seq = int(msg.metadata.sequence.stream)
        entry = book.entries.get(seq) if book is not None else None
        stale = (
            entry is not None
            and entry.state != REMOTE
            and (entry.delivery != int(msg.metadata.num_delivered))
        )
        return book, entry, stale

    @on_home
    async def ack(self, message: QueueMessage) -> None:
        """Settle the message here at once and send the ack (confirmed by a background task).

        Raises:
            TransportClosedError: the connection's loop is gone (the transport was reset).
        """
        msg = message.native
        book, entry, stale = self._entry(msg)
        if stale:
            logger.debug("ignoring the ack of %s: a stale handle", message_id(msg))
            return
        if book is not None and entry is not None:
            book.remove(entry.seq)
            self._changed.set()
        self._acks.send(msg)

    @on_home
    async def nack(self, message: QueueMessage, delay_seconds: float | None = None) -> bool:
        """``nak``, with the delay when given (JetStream redelivers the message after it; the
        session's later messages wait here meanwhile), else the configured retry back-off."""
        delay = delay_seconds or self._settings.retry_backoff or None
        await _logged(self._give_back(message.native, delay))
        return True

    async def _give_back(self, msg: Any, delay: float | None) -> None:
        book, entry, stale = self._entry(msg)
        if stale:
            return
        if book is not None and entry is not None:
            book.give_back(entry.seq, entry.delivery, self._loop.time())
        await msg.nak(delay=delay)

    @on_home
    async def dead_letter(self, message: QueueMessage) -> None:
        """Terminate redelivery of the message, once the server confirms it."""
        await _logged(self._terminate(message.native))

    async def _terminate(self, msg: Any) -> None:
        book, entry, stale = self._entry(msg)
        if stale:
            return
        await self._nc.request(msg.reply, b"+TERM", self._settings.request_timeout)
        if book is not None and entry is not None:
            book.remove(entry.seq)
            self._changed.set()

    @on_home
    async def extend_lease(self, message: QueueMessage) -> None:
        await _logged(message.native.in_progress())


async def _logged(coro: Awaitable[None]) -> None:
    """``coro``, whose failure is logged instead of raised."""
    try:
        await coro
    except Exception as exc:
        logger.warning("settling a NATS message failed (%r); its lease runs out instead", exc)
