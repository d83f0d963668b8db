"""What one fetched message goes through, written once for every driver: :class:`MessageHandling`.

Per message: it is counted (redeliveries, permanent failures), its lease is kept alive
(:mod:`.lease`), and it waits for the message before it of its group when one fetch returned
several of one group (SQS FIFO batches do). A message delivered more than ``max_receive_count``
times goes to the permanent-failure hook (which answers the caller) and is dead-lettered;
otherwise it is processed and acknowledged. A failure that is a store outage is tried again in
place without spending a delivery (:mod:`.outage`); any other failure hands the message back after
a delay that doubles per delivery, or through the transport's own delayed nack
(:mod:`.redelivery`). With isolation on, a suspect runs alone (:mod:`.isolation`).

Everything here runs on one event loop: the consumer loop's private one
(:class:`~agentkernel.pipeline.consumer.loop.ConsumerLoop`) or the HTTP server's
(:class:`~agentkernel.pipeline.consumer.in_loop.InLoopConsumer`). A sync ``process`` or hook runs
on a worker thread (wrap one that never blocks with
:func:`~agentkernel.core.blocking.nonblocking_async` to run it inline); the consumer is awaited
(a blocking one was adapted where it entered the pipeline).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from agentkernel.core import logs
from agentkernel.core.errors import RetryableError
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.consumer.handler import Handler, as_async, is_async_callable
from agentkernel.pipeline.consumer.isolation import Isolation, is_suspect
from agentkernel.pipeline.consumer.lease import LeaseKeeper
from agentkernel.pipeline.consumer.outage import OutageRetry
from agentkernel.pipeline.runtime import tracing
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.transport.base import TransportConsumer
from agentkernel.pipeline.transport.redelivery import (
    MAX_RETRY_BACKOFF_SECONDS,
    RETRY_BACKOFF_SECONDS,
    Redelivery,
)
from agentkernel.pipeline.wire.envelope import ATTR_REQUEST_ID, ATTR_TRACEPARENT, QueueMessage

logger = logging.getLogger(__name__)

#: The span of a turn on each side of the queue (:mod:`agentkernel.pipeline.runtime.tracing`).
SPAN_NAMES = {"input": "run", "output": "deliver"}


@dataclass(frozen=True)
class HandlingPolicy:
    """What happens to a message of one queue, whatever drives the fetching.

    Args:
        max_receive_count: deliveries allowed before the permanent-failure hook.
        lease_extension: extend a message's lease while it is being handled.
        isolate_last_attempt: run a redelivered message on its last allowed delivery (and the
            permanent-failure hook of one past it) alone, so a message that crashes the process
            (a poison turn) cannot use up the deliveries of messages in flight beside it.
        retry_backoff: seconds before a failed message's first redelivery; the delay doubles
            with each delivery up to ``max_retry_backoff`` seconds.
    """

    max_receive_count: int = 3
    lease_extension: bool = True
    isolate_last_attempt: bool = False
    retry_backoff: float = RETRY_BACKOFF_SECONDS
    max_retry_backoff: float = MAX_RETRY_BACKOFF_SECONDS


class MessageHandling:
    """Handles the messages of one queue on one event loop (see the module docstring).

    Args:
        process: handles one message; sync or ``async``. Raising hands the message back;
            raising ``StoreUnavailableError`` calls it again in place instead (the hook too).
        on_permanent_failure: runs for a message delivered more than ``max_receive_count``
            times, before it is dead-lettered; sync or ``async``. Raising leaves it queued.
        on_undecodable: runs for a message the transport could not decode (its
            ``undecodable`` reason is set), before it is dead-lettered, to answer its caller
            when its request id is known; sync or ``async``. Default: only dead-letter it.
        queue: the queue's name, for logs and metrics.
        policy: the delivery policy.
    """

    def __init__(
        self,
        process: Handler,
        on_permanent_failure: Handler,
        *,
        queue: str = "queue",
        policy: HandlingPolicy | None = None,
        on_undecodable: Handler | None = None,
        process_now: Callable[[QueueMessage], Any] | None = None,
    ) -> None:
        self.queue = str(queue)
        self.policy = policy if policy is not None else HandlingPolicy()
        self._process = as_async(process)
        self._on_permanent_failure = as_async(on_permanent_failure)
        self._on_undecodable = None if on_undecodable is None else as_async(on_undecodable)
        #: ``process`` runs on the event loop, so many messages can be in flight at once.
        self.is_async = is_async_callable(process)
        #: ``process`` as a plain call that never yields to the event loop, when there is one:
        #: what a message handed over goes through (:meth:`process_unqueued`).
        self._process_now = process_now
        self._stops: list[threading.Event] = [threading.Event()]
        self._log = RateLimitedLog(logger)
        self._leases = LeaseKeeper(f"{self.queue}-leases") if self.policy.lease_extension else None
        self._isolation = Isolation() if self.policy.isolate_last_attempt else None
        self._tails: dict[str, asyncio.Future[None]] = {}  # last message begun per group
        self._redelivery = Redelivery(
            self.queue,
            base=self.policy.retry_backoff,
            cap=self.policy.max_retry_backoff,
            stopping=self.stopping,
            release=self._untrack,
            log=self._log,
        )
        self._outage = OutageRetry(self.queue, stopping=self.stopping, log=self._log)
        #: Ids of the messages a drain gave back unfinished (they had started).
        self.handed_back: set[str] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    def stop_when(self, event: threading.Event) -> None:
        """Also stop (end holds and outage waits) once ``event`` is set."""
        self._stops.append(event)

    def stop(self) -> None:
        """End every hold and outage wait at once; their messages are handed back."""
        self._stops[0].set()

    def fetches_running(self, fetching: Callable[[], bool]) -> None:
        """Tell the handling whether a fetch of its consumers may still return messages.

        A stopping handling hands no failed message back while ``fetching()`` is true (at
        most the longest fetch, and never past the drain): the fetch in progress would take it
        again, and each bounce costs one of the message's deliveries.
        """
        self._redelivery.fetching = fetching

    def stopping(self) -> bool:
        """Whether the handling stops."""
        return any(event.is_set() for event in self._stops)

    def close(self) -> None:
        """Stop the lease keeper and flush the failure log, once nothing is in flight."""
        if self._leases is not None:
            self._leases.stop()
        self._log.flush()

    # -- fetching ------------------------------------------------------------------------------

    def fetch_open(self) -> bool:
        """False while a suspect message waits to run alone (see ``isolate_last_attempt``)."""
        return self._isolation is None or self._isolation.fetch_open.is_set()

    def begin(
        self,
        consumer: TransportConsumer,
        message: QueueMessage,
        holding: Callable[[], None] = lambda: None,
    ) -> Coroutine[Any, Any, None]:
        """The handling of a just-fetched message, to run on the handling's event loop.

        Called where the message was fetched, in fetch order: a suspect closes the fetching
        here, before the next fetch.

        Args:
            holding: called when the message stops running and only waits out its redelivery
                delay here (the caller may free its processing place).
        """
        if self._isolation is not None and self._suspect(message) and not message.undecodable:
            self._isolation.admit()
        return self._handle(consumer, message, holding)

    @property
    def processes_unqueued(self) -> bool:
        """Whether :meth:`process_unqueued` can be used (the handling has a ``process_now``)."""
        return self._process_now is not None

    def process_unqueued(self, message: QueueMessage) -> None:
        """Process a message its sender handed over instead of sending it (see
        :meth:`~agentkernel.pipeline.consumer.in_loop.InLoopConsumer.hand_over`): no lease, no
        ack, no redelivery, and in one call that never yields, so nothing else on the loop (a
        message of its group, a drain, a cancellation) can come between. Raising means it was
        not handled; its sender then queues it. Its records carry the sender's log context (the
        same request and trace id; binding the message's own cost 1 % of an embedded turn).

        Raises:
            RuntimeError: the handling was built without ``process_now``.
        """
        if self._process_now is None:
            raise RuntimeError(f"the handling of {self.queue} cannot process a message unqueued")
        with self._span(message):
            self._process_now(message)

    async def hand_back(
        self, consumer: TransportConsumer, message: QueueMessage, waited: float
    ) -> None:
        """Give back at once a message whose handling did not finish within the drain.

        Args:
            waited: seconds the drain waited for it (for the log line).
        """
        logger.warning(
            "drain of %s: message %s (request %s) still unfinished after %.1fs; handing it back",
            self.queue,
            message.message_id,
            message.attributes.get(ATTR_REQUEST_ID, "-"),
            waited,
        )
        if message.message_id is not None:
            self.handed_back.add(message.message_id)
        self._untrack(message)
        await self._redelivery.nack(consumer, message)

    # -- one message -------------------------------------------------------------------------

    async def _handle(
        self, consumer: TransportConsumer, message: QueueMessage, holding: Callable[[], None]
    ) -> None:
        with _log_context(message), self._span(message):  # this task's records name the turn
            await self._handle_in_context(consumer, message, holding)

    async def _handle_in_context(
        self, consumer: TransportConsumer, message: QueueMessage, holding: Callable[[], None]
    ) -> None:
        settled = asyncio.get_running_loop().create_future()
        previous = self._follow(message, settled)
        try:
            self._count(message)
            self._track(consumer, message)
            if previous is not None:
                logger.debug("message %s waits for the one before it", message.message_id)
                await asyncio.wait([previous])  # same group: strictly one by one
            logger.debug("handling %s (delivery %s)", message.message_id, message.receive_count)
            await self._settle(consumer, message, holding)
        finally:
            settled.set_result(None)
            if message.group_id is not None and self._tails.get(message.group_id) is settled:
                del self._tails[message.group_id]

    def _follow(
        self, message: QueueMessage, settled: asyncio.Future[None]
    ) -> asyncio.Future[None] | None:
        """Register ``message`` as its group's last; returns the one it must wait for."""
        group = message.group_id
        if group is None:
            return None
        previous = self._tails.get(group)
        self._tails[group] = settled
        return previous

    async def _settle(
        self, consumer: TransportConsumer, message: QueueMessage, holding: Callable[[], None]
    ) -> None:
        try:
            if message.undecodable is not None:
                await self._refuse(consumer, message)
            elif message.receive_count > self.policy.max_receive_count:
                await self._run(self._on_permanent_failure, message)
                self._untrack(message)
                await consumer.dead_letter(message)
            else:
                await self._run(self._process, message)
                self._untrack(message)
                await consumer.ack(message)
                logger.debug("acked %s", message.message_id)
        except Exception as exc:
            tracing.failed(exc)
            self._log_failure(message, exc)
            await self._redelivery.give_back(consumer, message, holding)

    async def _refuse(self, consumer: TransportConsumer, message: QueueMessage) -> None:
        """A message the transport could not decode: answer its caller if known, dead-letter it.

        Never processed nor handed back: no delivery can make it readable, and each one would
        hold its group (and, on a partitioned broker, every session beside it) for a lease.
        """
        report_undecodable(self.queue, message, "dead-lettering it")
        if self._on_undecodable is not None:
            hook = self._on_undecodable
            await self._outage.call(message, functools.partial(hook, message))
        self._untrack(message)
        await consumer.dead_letter(message)

    async def _run(
        self, fn: Callable[[QueueMessage], Awaitable[Any]], message: QueueMessage
    ) -> None:
        """``fn(message)``, tried again while a store is down, alone when it is a suspect."""
        work = functools.partial(self._outage.call, message, functools.partial(fn, message))
        if self._isolation is None:
            await work()
        elif self._suspect(message):
            logger.info(
                "message %s on %s is on its last delivery (%s); running it alone",
                message.message_id,
                self.queue,
                message.receive_count,
            )
            await self._isolation.run_alone(work)
        else:
            await self._isolation.run_normal(work)

    def _suspect(self, message: QueueMessage) -> bool:
        return is_suspect(message, self.policy.max_receive_count)

    def _count(self, message: QueueMessage) -> None:
        if message.receive_count > 1:
            METRICS.inc("agentkernel_redeliveries_total", queue=self.queue)
        if message.receive_count > self.policy.max_receive_count:
            METRICS.inc("agentkernel_permanent_failures_total", queue=self.queue)

    def _track(self, consumer: TransportConsumer, message: QueueMessage) -> None:
        if self._leases is not None:
            self._leases.track(consumer, message)

    def _untrack(self, message: QueueMessage) -> None:
        if self._leases is not None:
            self._leases.untrack(message)

    def _span(self, message: QueueMessage) -> contextlib.AbstractContextManager[str | None]:
        """The turn's span on this side of the queue (``run`` on INPUT, ``deliver`` on OUTPUT)."""
        name = SPAN_NAMES.get(self.queue)
        if name is None or not tracing.recording():
            return contextlib.nullcontext(None)
        about: dict[str, str | int] = {
            "messaging.destination.name": self.queue,
            "messaging.message.id": message.message_id or "",
            "agentkernel.request_id": message.attributes.get(ATTR_REQUEST_ID, ""),
            "agentkernel.session_id": message.group_id or "",
            "agentkernel.delivery": message.receive_count,
        }
        return tracing.span(name, message.attributes.get(ATTR_TRACEPARENT), "CONSUMER", about)

    def _log_failure(self, message: QueueMessage, exc: Exception) -> None:
        expected = isinstance(exc, RetryableError)  # asked for: its cause, not a traceback
        self._log.log(
            logging.WARNING,
            f"{self.queue}:{type(exc).__name__}",
            "message %s on %s (request %s, delivery %s) %s; it is delivered again in %.1fs",
            message.message_id,
            self.queue,
            message.attributes.get(ATTR_REQUEST_ID, "-"),
            message.receive_count,
            f"asked to be retried: {exc}" if expected else "failed",
            self._redelivery.delay(message),
            exc_info=not expected,
        )


def _log_context(message: QueueMessage) -> contextlib.AbstractContextManager[None]:
    return logs.bind(
        request_id=message.attributes.get(ATTR_REQUEST_ID),
        session_id=message.group_id,
        trace_id=logs.trace_id_of(message.attributes.get(ATTR_TRACEPARENT)),
    )


def report_undecodable(queue: str, message: QueueMessage, fate: str) -> None:
    """Count a message no transport could decode and log its one ERROR line, saying its ``fate``."""
    METRICS.inc("agentkernel_undecodable_messages_total", queue=queue)
    logger.error(
        "undecodable message %s on %s (request %s, delivery %s): %s; %s",
        message.message_id,
        queue,
        message.attributes.get(ATTR_REQUEST_ID, "-"),
        message.receive_count,
        message.undecodable,
        fate,
    )
