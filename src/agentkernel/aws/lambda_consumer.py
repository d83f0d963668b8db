"""``LambdaSQSConsumer``: a queue consumer driven by an SQS event source mapping.

The mapping polls, and deletes the records the handler did not report; the handler runs one
batch and returns ``{"batchItemFailures": [...]}``. Sessions of a batch run concurrently, the
records of one session in order; once a record of a session fails, that session's later
records are reported too without being run, so FIFO order survives the retry.

A record whose handler fails because a store cannot be reached is tried again in the same
invocation (as the container loops do, :mod:`agentkernel.pipeline.consumer.outage`) while the
function has time left, so a store outage of a few seconds does not spend its deliveries; only
when the invocation runs out of time is it reported for a retry.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, ClassVar, cast

from agentkernel.aws.container_loop import run_in_container
from agentkernel.aws.events import BadEvent, sqs_message
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.consumer.base import QueueConsumer
from agentkernel.pipeline.consumer.handler import as_async
from agentkernel.pipeline.consumer.handling import report_undecodable
from agentkernel.pipeline.consumer.lease import LeaseKeeper
from agentkernel.pipeline.consumer.outage import OutageRetry
from agentkernel.pipeline.consumer.records import on_record, record_message
from agentkernel.pipeline.transport.base import QueueTransport, TransportConsumer
from agentkernel.pipeline.transport.blocking import adapt_consumer
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

logger = logging.getLogger(__name__)
_outage_log = RateLimitedLog(logger)

#: Seconds of an invocation kept back for reporting the batch after a store outage wait.
RETURN_MARGIN_SECONDS = 5.0
#: How long a store outage is waited out when the invocation's time left is unknown (no context).
OUTAGE_WAIT_WITHOUT_CONTEXT = 30.0


class LambdaSQSConsumer(QueueConsumer):
    """Base of the Lambda consumers: one SQS batch per invocation.

    Subclasses give ``process_message``/``on_permanent_failure`` (from the pipeline component
    they adapt) and ``max_receive_count``. On the last allowed delivery a failure is answered
    with an error reply instead of being retried, so a caller is never left waiting when the
    queue's redrive policy moves the record to its dead-letter queue.
    """

    #: The queue consumed (a label in logs and metrics).
    queue: str
    transport: QueueTransport
    max_receive_count: int = 3

    @classmethod
    def handle(cls, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        """Lambda entry of a subclass written to the queue-mode guide.

        Its ``process_message`` and ``on_permanent_failure`` are class methods that take the
        raw records of the event (``messageId``, ``body``, ``attributes``, ...); they run on
        the same batch handling as the pipeline's own consumers. The receive limit is
        ``_get_max_receive_count()`` (default ``max_receive_count``).

        Returns:
            ``{"batchItemFailures": [...]}``: the records to deliver again.
        """
        return _GuideBatch.of(cls).handle_batch(event, context)

    @classmethod
    def reset(cls) -> None:
        """Forget the batch handlers built for guide-shaped subclasses (tests)."""
        _GuideBatch.built.clear()

    @classmethod
    def _get_max_receive_count(cls) -> int:
        """Upstream's hook for the receive limit; default :attr:`max_receive_count`."""
        return cls.max_receive_count

    def message_of(self, record: dict[str, Any]) -> QueueMessage:
        """The envelope of one event record.

        Raises:
            BadEvent: not an SQS record.
        """
        return sqs_message(record)

    def handle_batch(self, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        """Run one event source mapping batch; returns the records to retry.

        ``context`` (the Lambda context) tells how long a store outage may be waited out. The
        batch runs on the container's event loop, kept across warm invocations.
        """
        return run_in_container(self.handle_batch_async(event, context))

    async def handle_batch_async(
        self, event: dict[str, Any], context: Any = None
    ) -> dict[str, Any]:
        outage = OutageRetry(str(self.queue), stopping=_out_of_time(context), log=_outage_log)
        sessions: dict[str, list[QueueMessage]] = defaultdict(list)
        for record in event.get("Records") or []:
            try:
                message = self.message_of(record)
            except BadEvent:
                logger.error("dropping a record that is not an SQS message", exc_info=True)
                continue
            sessions[message.group_id or message.message_id or ""].append(message)
        leases = self._lease_keeper() if sessions else None
        try:
            failed = await asyncio.gather(
                *(self._session(ms, leases, outage) for ms in sessions.values())
            )
        finally:
            if leases is not None:
                leases[0].stop()
        return {"batchItemFailures": [{"itemIdentifier": i} for ids in failed for i in ids]}

    async def _session(
        self,
        messages: list[QueueMessage],
        leases: tuple[LeaseKeeper, TransportConsumer] | None,
        outage: OutageRetry,
    ) -> list[str]:
        for position, message in enumerate(messages):
            if leases is not None:
                leases[0].track(leases[1], message)
            try:
                await self._one(message, outage)
            except Exception:
                logger.warning("record %s failed; retrying it", message.message_id, exc_info=True)
                return [str(m.message_id) for m in messages[position:]]
            finally:
                if leases is not None:
                    leases[0].untrack(message)
        return []

    async def _one(self, message: QueueMessage, outage: OutageRetry) -> None:
        if message.undecodable is not None:
            await self._refuse_undecodable(message, outage)
            return
        if message.receive_count > self.max_receive_count:
            await _outlasting(outage, self.on_permanent_failure, message)
            return
        try:
            await _outlasting(outage, self.process_message, message)
        except Exception:
            if message.receive_count < self.max_receive_count:
                raise
            logger.warning(
                "record %s failed on its last attempt", message.message_id, exc_info=True
            )
            final = message.model_copy(update={"receive_count": message.receive_count + 1})
            await _outlasting(outage, self.on_permanent_failure, final)

    async def _refuse_undecodable(self, message: QueueMessage, outage: OutageRetry) -> None:
        """A record that cannot be decoded: answer its caller if its request id is known, then
        let it be deleted (returned as done). No retry can make it readable, and each one would
        hold its session's group; the ERROR line and the metric are what remains of it."""
        report_undecodable(self.queue, message, "answering and dropping it")
        hook = getattr(self, "on_undecodable", None)
        if hook is not None:
            await _outlasting(outage, hook, message)

    def _lease_keeper(self) -> tuple[LeaseKeeper, TransportConsumer] | None:
        """Extends the visibility of records still running near its end (SQS only)."""
        consumer = getattr(self, "_lease_consumer", None)
        if consumer is None:
            try:  # one per container: creating it reads the queue's visibility timeout
                made = self.transport.create_consumer(QueueName(self.queue))
                consumer = self._lease_consumer = adapt_consumer(made)
            except NotImplementedError:
                return None
        return LeaseKeeper(f"lambda-{self.queue}-leases"), consumer


class _GuideBatch(LambdaSQSConsumer):
    """Runs the batches of a guide-shaped subclass: its class methods get the raw records.

    One per subclass and container, reused by warm invocations like the pipeline's consumers.
    """

    built: ClassVar[dict[type, _GuideBatch]] = {}

    @classmethod
    def of(cls, owner: type[LambdaSQSConsumer]) -> _GuideBatch:
        """The batch handler of ``owner`` (built on its first invocation)."""
        batch = cls.built.get(owner)
        if batch is None:
            batch = cls.built[owner] = cls(owner)
        return batch

    def __init__(self, owner: type[LambdaSQSConsumer]) -> None:
        # Class methods of the subclass: already bound, they take the record alone.
        self._process = on_record(cast(Callable[[Any], Any], owner.process_message))
        self._failure = on_record(cast(Callable[[Any], Any], owner.on_permanent_failure))
        self.queue = owner.__name__
        self.max_receive_count = owner._get_max_receive_count()

    def message_of(self, record: dict[str, Any]) -> QueueMessage:
        """The record itself travels along: the subclass reads it as it likes (as upstream's
        consumers do, a record is not refused for a field the pipeline could not read)."""
        message = record_message(record) if isinstance(record, dict) else None
        if message is None or message.message_id is None:
            raise BadEvent("not an SQS record (no messageId to report it by)")
        return message

    def process_message(self, message: QueueMessage) -> Any:
        return self._process(message)

    def on_permanent_failure(self, message: QueueMessage) -> Any:
        return self._failure(message)

    def _lease_keeper(self) -> None:
        return None  # raw records are not leased through a transport (as on ECS)


def _out_of_time(context: Any) -> Callable[[], bool]:
    """A ``stopping()`` for :class:`OutageRetry`: true once the invocation must wrap up."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    seconds = (
        remaining() / 1000 - RETURN_MARGIN_SECONDS
        if remaining is not None
        else OUTAGE_WAIT_WITHOUT_CONTEXT
    )
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() >= deadline


async def _outlasting(outage: OutageRetry, fn: Any, message: QueueMessage) -> None:
    """Call ``fn``; while it fails on a store outage and time is left, call it again."""
    await outage.call(message, functools.partial(as_async(fn), message))
