"""The pull requests of an owning NATS consumer: one long poll per owned partition.

:class:`Pulling` sends them and files what they bring in the partitions' books; see
:class:`agentkernel.pipeline.transport.nats.consumer.NatsConsumer` for how they are used.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
from dataclasses import dataclass
from typing import Any

from agentkernel.core.config.queues import NatsQueueConfig
from agentkernel.pipeline.transport.nats.acks import message_id, nak_quietly
from agentkernel.pipeline.transport.nats.book import Book, session_key
from agentkernel.pipeline.transport.nats.changes import Changes
from agentkernel.pipeline.transport.nats.envelope import ENVELOPE_HEADER, decode_envelope
from agentkernel.pipeline.transport.nats.errors import CLIENT_ERRORS
from agentkernel.pipeline.transport.nats.owners import Owners

logger = logging.getLogger(__name__)

#: A long poll lasts at most this long, and ends this much before the ownership belief does.
PULL_SECONDS = 1.0
PULL_MARGIN_SECONDS = 0.25
#: The shortest long poll (a fetch that does not wait still asks each partition once).
MIN_PULL_SECONDS = 0.05
#: Messages one long poll may bring (the partition consumer's max_ack_pending caps it too).
PULL_BATCH = 64


#: A long poll whose answer (its last message or a 408) has not come this long after its
#: expiry counts as answered, so its partition is asked again (seen on a server shared with
#: busy clients: neither a message published as the poll expired nor the 408 arrived).
LOST_ANSWER_SECONDS = 1.0
#: A request for less than this is a no-wait probe: nats-server 2.9.10 was seen to leave a
#: long poll of 50 ms unanswered (neither a message nor its 408 came), now and then.
LONG_POLL_SECONDS = 0.25
#: An inbox replaced after a reconnect keeps listening this long: a pull sent on it after the
#: reconnect, before the housekeeping noticed it, is answered there (at most PULL_SECONDS on).
OLD_INBOX_SECONDS = PULL_SECONDS + LOST_ANSWER_SECONDS


@dataclass
class Request:
    number: int  # its reply subject is ``<inbox>.<partition>.<number>``
    left: int  # messages it may still bring
    due: float  # loop time by which the server has answered it (its expiry)


class Inbox:
    """The consumer's inbox and its open requests, one per partition at most.

    Each request replies to a subject of its own, ``<inbox>.<partition>.<number>``: the server
    may drop a request whose reply subject equals one it is still answering (a long poll sent
    as the previous one's 408 went out was never answered), and a late status of an earlier
    request must not end the current one. Messages carry their own subject (the partition's)
    and count against the partition's current request.
    """

    def __init__(self, inbox: str, reconnects: int) -> None:
        self.inbox = inbox
        self.reconnects = reconnects  # the connection's reconnect count when it was opened
        self.sub: Any = None
        self.open: dict[int, Request] = {}
        self._numbers = itertools.count()

    def request(self, partition: int, batch: int, expires: float, now: float) -> tuple[str, bytes]:
        """Record a request for ``partition``; returns its reply subject and body."""
        number = next(self._numbers)
        self.open[partition] = Request(number, batch, now + expires)
        if expires < LONG_POLL_SECONDS:  # answered at once: messages, then a 404 or a 408
            body = json.dumps({"batch": batch, "no_wait": True}).encode()
        else:
            body = json.dumps({"batch": batch, "expires": int(expires * 1e9)}).encode()
        return f"{self.inbox}.{partition}.{number}", body

    def answered(self, partition: int, status: str | None, number: int | None) -> bool:
        """A reply came (``number``: the request a status answers); returns whether it ended
        the partition's request."""
        request = self.open.get(partition)
        if request is None or (status is not None and number != request.number):
            return False
        if status is None:
            request.left -= 1
            if request.left > 0:
                return False
        elif status == "100":  # a heartbeat
            return False
        del self.open[partition]
        return True

    def forget_overdue(self, now: float) -> list[int]:
        """Stop counting as open the requests whose answer is overdue (see
        ``LOST_ANSWER_SECONDS``); returns their partitions."""
        lost = [p for p, r in self.open.items() if now > r.due + LOST_ANSWER_SECONDS]
        for partition in lost:
            del self.open[partition]
        return lost


def partition_of_reply(subject: str) -> int:
    """The partition a message's subject (``<prefix>.<partition>``) names."""
    tail = subject.rsplit(".", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def status_of(subject: str) -> tuple[int, int | None]:
    """The partition and request number a status reply's subject names."""
    *_, partition, number = subject.rsplit(".", 2)
    if partition.isdigit() and number.isdigit():
        return int(partition), int(number)
    return -1, None


class Pulling:
    """The long polls of :class:`~.consumer.NatsConsumer` (their state is set up there): one
    open per owned partition while a fetch waits, asked on the consumer's inbox, what they
    bring kept in the partition's :class:`~.book.Book`. All on the connection's loop."""

    _stream: str
    _settings: NatsQueueConfig
    _nc: Any
    _loop: asyncio.AbstractEventLoop
    _books: dict[int, Book]
    _owners: Owners
    _changed: Changes
    _inbox: Inbox | None
    _old_inboxes: list[tuple[float, Any]]  # (unsubscribe at, subscription)
    _wanted: int  # the waiting fetch's demand
    _wanted_until: float  # and its deadline
    _fetching_stopped: bool
    _closed: bool

    def _spawn(self, coro: Any) -> None:
        raise NotImplementedError

    async def _open_inbox(self) -> None:
        if self._inbox is not None:  # what it still receives goes to the books (see _on_reply)
            self._old_inboxes.append((self._loop.time() + OLD_INBOX_SECONDS, self._inbox.sub))
        inbox = Inbox(self._nc.new_inbox(), self._nc.stats["reconnects"])
        reply = functools.partial(self._on_reply, inbox)
        inbox.sub = await self._nc.subscribe(f"{inbox.inbox}.>", cb=reply)
        self._inbox = inbox

    def _busy(self, partition: int) -> bool:
        """Whether handing ``partition`` back now would give messages back (see ``Owners``)."""
        book = self._books.get(partition)
        open_request = self._inbox is not None and partition in self._inbox.open
        return open_request or (book is not None and bool(book.entries))

    def _pull_idle(self) -> None:
        """:meth:`_pull` each owned partition that has no request open."""
        if self._inbox is not None:
            for partition in self._books.keys() - self._inbox.open.keys():
                self._pull(partition)

    def _pull(self, partition: int) -> None:
        """Ask an owned partition for up to the waiting fetch's demand, for at most the rest of
        its wait (so nothing arrives long after the last fetch: what arrives unasked would
        be given back at close, each one a delivery more)."""
        inbox, now = self._inbox, self._loop.time()
        if inbox is None or partition in inbox.open or self._fetching_stopped or self._closed:
            return
        claim = self._owners.claims.get(partition)
        if claim is None or partition not in self._books or partition in self._owners.leaving:
            return
        wait = max(self._wanted_until - now, MIN_PULL_SECONDS)
        expires = min(wait, PULL_SECONDS, claim.until - now - PULL_MARGIN_SECONDS)
        if expires < MIN_PULL_SECONDS:
            return  # the belief ends soon: the next renewal lets it pull again
        reply, body = inbox.request(partition, min(self._wanted, PULL_BATCH), expires, now)
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self._stream}.{self._stream}-p{partition}"
        self._spawn(self._nc.publish(subject, body, reply))

    async def _on_reply(self, inbox: Inbox, msg: Any) -> None:
        """A message (its subject is the partition's) or a status (to its request's subject)."""
        status = (msg.headers or {}).get("Status")
        if status is None:
            partition, number = partition_of_reply(msg.subject), None
        else:
            partition, number = status_of(msg.subject)
        ended = inbox is self._inbox and inbox.answered(partition, status, number)
        if status is None:
            self._receive(partition, msg)
        if ended:
            self._changed.set()
            if status == "408" and self._wanted_until > self._loop.time() + LONG_POLL_SECONDS:
                self._pull(partition)  # a fetch still waits for its first message

    def _receive(self, partition: int, msg: Any) -> None:
        book = self._books.get(partition)
        if book is None:  # not ours (any more): whoever owns it gets it
            logger.info(
                "giving back %s: partition %s is not owned here", message_id(msg), partition
            )
            self._spawn(nak_quietly(msg))
            return
        meta = msg.metadata
        try:
            group, _ = decode_envelope((msg.headers or {}).get(ENVELOPE_HEADER))
        except ValueError:
            group = None
        seq = int(meta.sequence.stream)
        book.receive(msg, seq, session_key(group, seq), int(meta.num_delivered), self._loop.time())
        self._changed.set()

    async def _tend_inboxes(self, now: float) -> None:
        """Open a new inbox after a reconnect, retire old ones, forget unanswered requests."""
        if self._inbox is not None and self._inbox.reconnects != self._nc.stats["reconnects"]:
            self._inbox.open.clear()  # the server forgot the old connection's requests
            await self._open_inbox()
        while self._old_inboxes and self._old_inboxes[0][0] <= now:
            self._retire(self._old_inboxes.pop(0)[1])
        if self._inbox is not None:
            for partition in self._inbox.forget_overdue(now):
                logger.warning(
                    "%s: no answer to the long poll of partition %s", self._stream, partition
                )

    def _retire(self, sub: Any) -> None:
        self._spawn(self._drain(sub))

    async def _drain(self, sub: Any) -> None:
        with contextlib.suppress(*CLIENT_ERRORS):
            await asyncio.wait_for(sub.unsubscribe(), self._settings.request_timeout)
            return
        with contextlib.suppress(Exception):  # the connection is gone: forget it locally
            sub._stop_processing()
            self._nc._remove_sub(sub._id)
