"""The pull requests of an owning NATS consumer: one long poll per owned partition.

See :class:`agentkernel.pipeline.transport.nats.consumer.NatsConsumer` for how they are used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: A long poll whose answer (its last message or a 408) has not come this long after its
#: expiry counts as answered, so its partition is asked again (seen on a server shared with
#: busy clients: neither a message published as the poll expired nor the 408 arrived).
LOST_ANSWER_SECONDS = 1.0


@dataclass
class Request:
    left: int  # messages it may still bring
    due: float  # loop time by which the server has answered it (its expiry)


class Inbox:
    """The consumer's reply subject ``<inbox>.<partition>`` and its open requests."""

    def __init__(self, inbox: str, reconnects: int) -> None:
        self.inbox = inbox
        self.reconnects = reconnects  # the connection's reconnect count when it was opened
        self.sub: Any = None
        self.open: dict[int, Request] = {}

    def request(self, partition: int, batch: int, expires: float, now: float) -> bytes:
        """Record a request for ``partition``; returns its body."""
        self.open[partition] = Request(batch, now + expires)
        return json.dumps({"batch": batch, "expires": int(expires * 1e9)}).encode()

    def answered(self, partition: int, status: str | None) -> bool:
        """A reply came; returns whether it ended the partition's request."""
        request = self.open.get(partition)
        if request is None:
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
    tail = subject.rsplit(".", 1)[-1]
    return int(tail) if tail.isdigit() else -1
