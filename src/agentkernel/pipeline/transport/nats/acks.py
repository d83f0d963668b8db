"""Acknowledgements of a NATS consumer: sent at once, confirmed later, sent again if lost.

Naks and in-progress acks nobody waits for go through :func:`nak_quietly` and
:func:`in_progress_quietly`: a failure there only lets the lease run out.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Any

from agentkernel.core.config.queues import NatsQueueConfig
from agentkernel.pipeline.transport.nats.errors import CLIENT_ERRORS
from agentkernel.pipeline.transport.redelivery import backoff

logger = logging.getLogger(__name__)

#: Seconds an ack waits for the server's confirmation (at most ``request_timeout``); an ack not
#: confirmed is sent again after a delay doubling up to the maximum, while the lease lasts.
ACK_TIMEOUT_SECONDS = 2.0
ACK_RETRY_SECONDS = 0.5
MAX_ACK_RETRY_SECONDS = 5.0


class Acks:
    """The acks one consumer sent, on the connection's loop.

    Args:
        settings: the consumer's ``execution.queues.nats`` block.
        nc: the connection (its ``is_closed`` ends the retries).
        retiring: the consumer's background tasks, which ``close`` awaits; retries join them.
        closed: whether the consumer is closed (retries stop).
    """

    def __init__(
        self,
        settings: NatsQueueConfig,
        nc: Any,
        retiring: set[asyncio.Task[None]],
        closed: Callable[[], bool],
    ) -> None:
        self._settings = settings
        self._nc = nc
        self._retiring = retiring
        self._closed = closed
        self.pending: set[asyncio.Task[None]] = set()  # acks sent, confirmation not yet in

    def send(self, msg: Any) -> None:
        task = asyncio.ensure_future(self._confirm(msg))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _confirm(self, msg: Any) -> None:
        loop = asyncio.get_running_loop()
        # The lease was extended at most ack_wait / 3 ago (while the turn ran), so at least two
        # thirds of it are left: an ack confirmed before then acknowledges this delivery.
        give_up = loop.time() + self._settings.ack_wait * 2 / 3
        try:
            await msg.ack_sync(timeout=self._timeout(give_up))
        except CLIENT_ERRORS as exc:  # kept trying apart: fetches do not wait for those
            task = asyncio.ensure_future(self._again(msg, exc, give_up))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _again(self, msg: Any, exc: Exception, give_up: float) -> None:
        """Ack until the server confirms it, while the message's lease lasts.

        An ack lost to a server restart would otherwise hold the message's partition, and every
        session on it, for a whole ``ack_wait``: JetStream keeps the message pending and
        redelivers it only then.
        """
        loop = asyncio.get_running_loop()
        for attempt in itertools.count():
            delay = backoff(ACK_RETRY_SECONDS, MAX_ACK_RETRY_SECONDS, attempt)
            if self._closed() or self._nc.is_closed or loop.time() + delay >= give_up:
                logger.warning(  # as if lost: the lease runs out and it comes again
                    "ack of %s was not confirmed (%r); it is delivered again after its lease",
                    message_id(msg),
                    exc,
                )
                return
            await asyncio.sleep(delay)
            try:
                await msg.ack_sync(timeout=self._timeout(give_up))
            except CLIENT_ERRORS as again:
                exc = again
                continue
            logger.info("ack of %s confirmed on try %s", message_id(msg), attempt + 2)
            return

    def _timeout(self, give_up: float) -> float:
        left = give_up - asyncio.get_running_loop().time()
        return max(min(self._settings.request_timeout, ACK_TIMEOUT_SECONDS, left), 0.1)


def message_id(msg: Any) -> str:
    """``stream:sequence`` of a JetStream message, for logs (``?`` when it has no metadata)."""
    with contextlib.suppress(Exception):
        return f"{msg.metadata.stream}:{msg.metadata.sequence.stream}"
    return "?"


async def nak_quietly(msg: Any) -> None:
    with contextlib.suppress(*CLIENT_ERRORS):
        await msg.nak()


async def in_progress_quietly(msg: Any) -> None:
    with contextlib.suppress(*CLIENT_ERRORS):
        await msg.in_progress()
