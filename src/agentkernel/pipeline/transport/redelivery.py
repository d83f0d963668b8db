"""Handing a failed message back to its broker, after a delay that doubles with each delivery.

A message whose handling failed is not nacked at once: a broker outage would otherwise turn every
message into a tight retry loop (hundreds of deliveries a second, a log line each). The delay is
``base * 2**(receive_count - 1)`` seconds, capped. Where the transport can delay a redelivery
itself (:meth:`TransportConsumer.nack` with a delay) it does; otherwise the message and its
lease are kept for the delay in the message's own task, so other messages go on meanwhile. A
stopping handling ends every wait at once, but hands nothing back while its own fetches are still
running: a fetch in progress would take the message again and spend one of its deliveries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.transport.base import TransportConsumer
from agentkernel.pipeline.wire.envelope import QueueMessage

logger = logging.getLogger(__name__)

#: Delay before the first redelivery of a failed message, in seconds; doubles per delivery.
RETRY_BACKOFF_SECONDS = 0.5
MAX_RETRY_BACKOFF_SECONDS = 30.0
#: Longest sleep between two looks at the stop flag while a message is held, in seconds.
STOP_CHECK_SECONDS = 0.25
#: While stopping, how often a message to hand back looks whether the fetches ended, in seconds.
FETCH_END_POLL_SECONDS = 0.02
#: Longest wait for the fetches to end before a stopping handling hands a message back anyway:
#: longer than the longest fetch (an SQS long poll, 20 s). The drain's own bound still holds: a
#: message still waiting at the drain timeout is handed back by the drain, once fetching ended.
MAX_FETCH_END_WAIT_SECONDS = 25.0


def backoff(base: float, cap: float, attempt: int) -> float:
    """``base`` doubled ``attempt`` times (counted from 0), at most ``cap`` seconds."""
    return float(min(base * 2 ** min(max(attempt, 0), 30), cap))


async def pause(seconds: float, stopping: Callable[[], bool]) -> None:
    """Sleep ``seconds`` on the event loop, cut short once ``stopping()`` is true."""
    deadline = time.monotonic() + seconds
    while not stopping() and (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(left, STOP_CHECK_SECONDS))


class Redelivery:
    """Gives the failed messages of one queue's handling back to the broker.

    Args:
        queue: the queue's name, for logs and the holding thread's name.
        base: seconds before a message's first redelivery.
        cap: longest delay, in seconds.
        stopping: true once the handling stops; every hold then ends at once.
        release: called just before a message is handed back (ends its lease extension).
        log: the handling's rate-limited log.

    Attributes:
        fetching: true while a fetch of the handling's consumers may still return messages;
            a stopping handling waits (bounded) for it to turn false before handing back.
    """

    def __init__(
        self,
        queue: str,
        *,
        base: float,
        cap: float,
        stopping: Callable[[], bool],
        release: Callable[[QueueMessage], None],
        log: RateLimitedLog,
    ) -> None:
        if base < 0 or cap < 0:
            raise ValueError("retry back-offs must not be negative")
        self._queue, self._base, self._cap = queue, base, cap
        self._stopping, self._release, self._log = stopping, release, log
        self.fetching: Callable[[], bool] = lambda: False

    def delay(self, message: QueueMessage) -> float:
        """Seconds to wait before ``message`` is delivered again."""
        return backoff(self._base, self._cap, message.receive_count - 1)

    async def give_back(
        self,
        consumer: TransportConsumer,
        message: QueueMessage,
        holding: Callable[[], None] = lambda: None,
    ) -> None:
        """Hand back after the delay (sooner if the handling stops).

        Args:
            holding: called (maybe more than once) when the message is kept here without
                running: for the delay (the broker cannot delay it) or, when stopping, until
                the fetches ended; the caller can free the message's processing place meanwhile.
        """
        if self._stopping():
            holding()  # not running any more: its place may take a message fetched late
            await self._fetches_ended()
        if await self._nacked_later(consumer, message):
            return
        holding()  # frees the place once, however often it is called
        await pause(self.delay(message), self._stopping)
        await self._fetches_ended()
        self._release(message)
        await self.nack(consumer, message)

    async def _fetches_ended(self) -> None:
        """When stopping: wait until no fetch of this handling can take a handed-back message."""
        deadline = time.monotonic() + MAX_FETCH_END_WAIT_SECONDS
        while self._stopping() and self.fetching() and time.monotonic() < deadline:
            await asyncio.sleep(FETCH_END_POLL_SECONDS)

    async def nack(self, consumer: TransportConsumer, message: QueueMessage) -> None:
        """Hand ``message`` back at once; a failure is logged (its lease then runs out)."""
        try:
            await consumer.nack(message)
        except Exception as exc:
            self._log.log(
                logging.ERROR,
                f"{self._queue}:nack:{type(exc).__name__}",
                "nack of %s on %s failed",
                message.message_id,
                self._queue,
                exc_info=True,
            )

    async def _nacked_later(self, consumer: TransportConsumer, message: QueueMessage) -> bool:
        """Let the transport delay the redelivery itself, where it can."""
        delay = self.delay(message)
        try:
            if delay and await consumer.nack(message, delay):
                self._release(message)
                return True
        except Exception:
            logger.warning("delayed nack of %s failed", message.message_id, exc_info=True)
        return False
