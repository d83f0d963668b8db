"""Riding out a store outage: a message is tried again where it is, its deliveries kept.

A message whose handling failed because a store could not be reached
(:class:`~agentkernel.core.errors.StoreUnavailableError`, the session store's included) says
nothing about the message itself. Handing it back would spend one of its ``max_receive_count``
deliveries per attempt, and the doubling redelivery delay uses them all up within about two
seconds: a few seconds of outage would then send the turn to the permanent-failure hook, and on
SQS the next receive would move it to the dead-letter queue, its caller never answered. So the
message handling keeps such a message, its lease still extended, and runs its handler again after
a delay that doubles from ``OUTAGE_RETRY_SECONDS`` to ``MAX_OUTAGE_RETRY_SECONDS``, until it gets
through or the handling stops (then the failure is handed back like any other).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable

from agentkernel.core.errors import StoreUnavailableError
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.transport.redelivery import backoff, pause
from agentkernel.pipeline.wire.envelope import ATTR_REQUEST_ID, QueueMessage

#: Delay before a message is tried again during a store outage, in seconds; doubles per try.
OUTAGE_RETRY_SECONDS = 0.5
#: Longest such delay, in seconds: short, so a store that is back is noticed soon.
MAX_OUTAGE_RETRY_SECONDS = 5.0


class OutageRetry:
    """Decides whether a failed handler call is tried again in place, and waits before it.

    Args:
        queue: the queue's name, for logs.
        stopping: true once the handling stops; a stopping handling tries nothing again.
        log: the handling's rate-limited log.
    """

    def __init__(self, queue: str, *, stopping: Callable[[], bool], log: RateLimitedLog) -> None:
        self._queue, self._stopping, self._log = queue, stopping, log

    @staticmethod
    def delay(attempt: int) -> float:
        """Seconds before try ``attempt + 2`` (``attempt`` counts from 0)."""
        return backoff(OUTAGE_RETRY_SECONDS, MAX_OUTAGE_RETRY_SECONDS, attempt)

    async def call(self, message: QueueMessage, fn: Callable[[], Awaitable[object]]) -> None:
        """Await ``fn()``, called again while it fails on a store outage.

        Raises:
            Exception: what ``fn`` raised, once it is not an outage or the handling stops.
        """
        for attempt in itertools.count():
            try:
                await fn()
                return
            except Exception as exc:
                if not await self._wait(message, exc, attempt):
                    raise

    async def _wait(self, message: QueueMessage, exc: Exception, attempt: int) -> bool:
        """Wait before trying again; ``False``: hand the failure on."""
        if not isinstance(exc, StoreUnavailableError) or self._stopping():
            return False
        self._log.log(
            logging.WARNING,
            f"{self._queue}:outage:{type(exc).__name__}",
            "message %s on %s (request %s, delivery %s): %s; trying again in %.1fs, "
            "keeping the message",
            message.message_id,
            self._queue,
            message.attributes.get(ATTR_REQUEST_ID, "-"),
            message.receive_count,
            exc,
            self.delay(attempt),
        )
        await pause(self.delay(attempt), self._stopping)
        return not self._stopping()
