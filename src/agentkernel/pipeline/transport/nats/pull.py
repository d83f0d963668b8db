"""The pull requests of an owning NATS consumer: one long poll per owned partition.

See :class:`agentkernel.pipeline.transport.nats.consumer.NatsConsumer` for how they are used.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

#: A long poll whose answer (its last message or a 408) has not come this long after its
#: expiry counts as answered, so its partition is asked again (seen on a server shared with
#: busy clients: neither a message published as the poll expired nor the 408 arrived).
LOST_ANSWER_SECONDS = 1.0
#: A request for less than this is a no-wait probe: nats-server 2.9.10 was seen to leave a
#: long poll of 50 ms unanswered (neither a message nor its 408 came), now and then.
LONG_POLL_SECONDS = 0.25


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
