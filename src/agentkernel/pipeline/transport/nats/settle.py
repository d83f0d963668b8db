"""Settling what a NATS consumer handed out: ack, nak, terminate, extend, per delivery.

Each settles the delivery's entry in its partition's book (see :mod:`.book`) as well as on the
server: an ack or a termination frees the session's next message, a nak keeps the session
waiting for the redelivery. A stale handle (a newer delivery of the message is current here)
changes nothing.

Called on the connection's loop (the consumer loop handles NATS messages there), none of them
waits: the book is settled at once and what goes to the server is sent by a task, whose failure
is logged (the message's lease then runs out and it comes again). Called from another thread,
``nack``, ``dead_letter`` and ``extend_lease`` wait for the server, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from agentkernel.core.config.queues import NatsQueueConfig
from agentkernel.core.errors import TransportError
from agentkernel.pipeline.transport.blocking import BlockingConsumer
from agentkernel.pipeline.transport.nats.acks import Acks, message_id
from agentkernel.pipeline.transport.nats.book import REMOTE, Book, Entry
from agentkernel.pipeline.transport.nats.changes import Changes
from agentkernel.pipeline.transport.nats.pull import partition_of_reply
from agentkernel.pipeline.wire.envelope import QueueMessage

logger = logging.getLogger(__name__)


class Settling(BlockingConsumer):
    """The settle methods of :class:`~.consumer.NatsConsumer` (their state is set up there)."""

    #: On the connection's loop nothing here waits (see the module docstring).
    nonblocking = True

    _stream: str
    _settings: NatsQueueConfig
    _nc: Any
    _loop: asyncio.AbstractEventLoop
    _books: dict[int, Book]
    _drained: dict[int, Book]
    _changed: Changes
    _acks: Acks

    def _run(self, coro: Any) -> Any:
        raise NotImplementedError

    def _spawn(self, coro: Any) -> None:
        raise NotImplementedError

    def _settle(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro``: as a task when called on the connection's loop, else waiting for it."""
        if asyncio._get_running_loop() is self._loop:
            self._spawn(_logged(coro))
        else:
            self._run(coro)

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

    def ack(self, message: QueueMessage) -> None:
        """Settle the message here at once and send the ack (confirmed by a background task).

        Raises:
            TransportError: the connection's loop is gone (the transport was reset).
        """
        if asyncio._get_running_loop() is self._loop:
            self._ack(message.native)
            return
        try:
            self._loop.call_soon_threadsafe(self._ack, message.native)
        except RuntimeError as exc:
            raise TransportError(f"NATS connection of {self._stream} is closed") from exc

    def _ack(self, msg: Any) -> None:
        book, entry, stale = self._entry(msg)
        if stale:
            logger.debug("ignoring the ack of %s: a stale handle", message_id(msg))
            return
        if book is not None and entry is not None:
            book.remove(entry.seq)
            self._changed.set()
        self._acks.send(msg)

    def nack(self, message: QueueMessage) -> None:
        self._settle(self._give_back(message.native, self._settings.retry_backoff or None))

    def nack_later(self, message: QueueMessage, delay_seconds: float) -> bool:
        """``nak`` with the delay: JetStream redelivers the message after it; the session's
        later messages wait here meanwhile."""
        self._settle(self._give_back(message.native, delay_seconds))
        return True

    async def _give_back(self, msg: Any, delay: float | None) -> None:
        book, entry, stale = self._entry(msg)
        if stale:
            return
        if book is not None and entry is not None:
            book.give_back(entry.seq, entry.delivery, self._loop.time())
        await msg.nak(delay=delay)

    def dead_letter(self, message: QueueMessage) -> None:
        """Terminate redelivery of the message (off the loop: and wait for the server to confirm
        it)."""
        self._settle(self._terminate(message.native))

    async def _terminate(self, msg: Any) -> None:
        book, entry, stale = self._entry(msg)
        if stale:
            return
        await self._nc.request(msg.reply, b"+TERM", self._settings.request_timeout)
        if book is not None and entry is not None:
            book.remove(entry.seq)
            self._changed.set()

    def extend_lease(self, message: QueueMessage) -> None:
        self._settle(message.native.in_progress())


async def _logged(coro: Coroutine[Any, Any, None]) -> None:
    """``coro``, whose failure is logged instead of raised (no caller waits for it)."""
    try:
        await coro
    except Exception as exc:
        logger.warning("settling a NATS message failed (%r); its lease runs out instead", exc)
