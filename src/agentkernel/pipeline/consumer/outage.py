"""Riding out a store outage: a message is tried again where it is, its deliveries kept.

A message whose handling failed because a store could not be reached
(:class:`~agentkernel.core.errors.StoreUnavailableError`, the session store's included) says
nothing about the message itself. Handing it back would spend one of its ``max_receive_count``
deliveries per attempt, and the doubling redelivery delay uses them all up within about two
seconds: a few seconds of outage would then send the turn to the permanent-failure hook, and on
SQS the next receive would move it to the dead-letter queue, its caller never answered. So the
consumer loop keeps such a message, its lease still extended, and runs its handler again after a
delay that doubles from ``OUTAGE_RETRY_SECONDS`` to ``MAX_OUTAGE_RETRY_SECONDS``, until it gets
through or the loop stops (then the failure is handed back like any other).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable

from agentkernel.core.errors import StoreUnavailableError
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.consumer.redelivery import backoff, pause, pause_blocking
from agentkernel.pipeline.envelope import ATTR_REQUEST_ID, QueueMessage

#: Delay before a message is tried again during a store outage, in seconds; doubles per try.
OUTAGE_RETRY_SECONDS = 0.5
#: Longest such delay, in seconds: short, so a store that is back is noticed soon.
MAX_OUTAGE_RETRY_SECONDS = 5.0


class OutageRetry:
    """Decides whether a failed handler call is tried again in place, and waits before it.

    Args:
        queue: the queue's name, for logs.
        stopping: true once the loop stops; a stopping loop tries nothing again.
        log: the loop's rate-limited log.
    """

    def __init__(self, queue: str, *, stopping: Callable[[], bool], log: RateLimitedLog) -> None:
        self._queue, self._stopping, self._log = queue, stopping, log

    @staticmethod
    def delay(attempt: int) -> float:
        """Seconds before try ``attempt + 2`` (``attempt`` counts from 0)."""
        return backoff(OUTAGE_RETRY_SECONDS, MAX_OUTAGE_RETRY_SECONDS, attempt)

    def call(self, message: QueueMessage, fn: Callable[[], object]) -> None:
        """From a consumer thread: ``fn()``, called again while it fails on a store outage."""
        for attempt in itertools.count():
            try:
                fn()
                return
            except Exception as exc:
                if not self.wait(message, exc, attempt):
                    raise

    async def call_async(self, message: QueueMessage, fn: Callable[[], Awaitable[object]]) -> None:
        """From a message's task: as :meth:`call`, awaiting ``fn()``."""
        for attempt in itertools.count():
            try:
                await fn()
                return
            except Exception as exc:
                if not await self.wait_async(message, exc, attempt):
                    raise

    def wait(self, message: QueueMessage, exc: Exception, attempt: int) -> bool:
        """From a consumer thread: wait before trying again; ``False``: hand the failure on."""
        if not self._applies(message, exc, attempt):
            return False
        pause_blocking(self.delay(attempt), self._stopping)
        return not self._stopping()

    async def wait_async(self, message: QueueMessage, exc: Exception, attempt: int) -> bool:
        """From a message's task: as :meth:`wait`, without blocking the event loop."""
        if not self._applies(message, exc, attempt):
            return False
        await pause(self.delay(attempt), self._stopping)
        return not self._stopping()

    def _applies(self, message: QueueMessage, exc: Exception, attempt: int) -> bool:
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
        return True
