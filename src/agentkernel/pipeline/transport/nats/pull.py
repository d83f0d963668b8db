"""The pull requests of a NATS consumer's fetches, and what their replies say.

See :class:`agentkernel.pipeline.transport.nats.consumer.NatsConsumer` for how a fetch uses them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class Pull:
    """The pull requests of one fetch: they all reply to ``<inbox>.<partition>``."""

    def __init__(self, inbox: str, hold: Callable[[Any], None], changed: asyncio.Event) -> None:
        self.inbox = inbox
        self.sub: Any = None
        self.reconnects = 0  # the connection's reconnect count when the inbox was opened
        self.open: set[int] = set()  # partitions with a request not answered yet
        self.answered: set[int] = set()  # partitions that replied (a message or a status)
        self.idle: set[int] = set()  # partitions that had nothing for this request
        self.probing: dict[int, float] = {}  # the current probe wave: partition -> sent at
        #: Long polls still open: partition -> loop time by which the server must have answered.
        self.due: dict[int, float] = {}
        self.latencies: list[float] = []  # seconds from probe to answer, within the wave
        self._hold = hold
        self._changed = changed

    def reset(self) -> Pull:
        """Forget the last fetch's answers (not its open requests), to serve the next fetch."""
        self.answered.clear()
        self.idle = set()  # the consumer keeps the old set to order its next probes
        self.probing.clear()
        self.latencies.clear()
        return self

    def expect(self, partition: int, by: float) -> None:
        """A long poll of ``partition`` went out: the server answers it by ``by`` (loop time)."""
        self.due[partition] = by

    def forget_unanswered(self, now: float) -> list[int]:
        """Stop counting as open the long polls whose answer is overdue at ``now``.

        The server answers a long poll by its expiry, with a message or a 408. When that answer
        never arrives (seen on a server shared with busy clients: a message published as the
        poll expired was counted as delivered, and neither it nor the 408 came), the partition
        would count as asked for as long as the inbox lives, and never be asked again. Its
        message comes back after ``ack_wait``, to a request this lets the next fetch send.

        Returns:
            the partitions forgotten.
        """
        lost = [p for p, by in self.due.items() if now > by]
        for partition in lost:
            del self.due[partition]
            self.open.discard(partition)
        return lost

    async def on_reply(self, msg: Any) -> None:
        status = (msg.headers or {}).get("Status")
        partition = partition_of_reply(msg.subject)
        if (sent := self.probing.pop(partition, None)) is not None:
            self.latencies.append(asyncio.get_running_loop().time() - sent)
        self.answered.add(partition)
        if status != "100":  # anything but a heartbeat ends a request for one message
            self.open.discard(partition)
            self.due.pop(partition, None)
        if status is None:
            self._hold(msg)
        elif status in ("404", "408"):  # no messages; expired or others are waiting first
            self.idle.add(partition)
        self._changed.set()


def partition_of_reply(subject: str) -> int:
    tail = subject.rsplit(".", 1)[-1]
    return int(tail) if tail.isdigit() else -1
