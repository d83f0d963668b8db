"""Consumers written to the queue-mode guide: class methods over the broker's raw records.

Such a :class:`~agentkernel.pipeline.consumer.base.QueueConsumer` subclass gives ``poll`` (one
batch of raw records), ``delete_message``, ``process_message`` and ``on_permanent_failure`` as
class methods and never sees a :class:`QueueMessage`. It runs on the one
:class:`~agentkernel.pipeline.consumer.loop.ConsumerLoop`: :class:`RecordConsumer` is a transport
consumer over its ``poll`` and ``delete_message``, each record travels as the ``native`` of an
envelope that only carries what the loop needs (receive count, group, id), and the handling
calls the subclass's methods with the record itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from agentkernel.pipeline.consumer.handler import is_async_callable
from agentkernel.pipeline.transport.blocking import BlockingConsumer
from agentkernel.pipeline.wire.envelope import QueueMessage

if TYPE_CHECKING:
    import threading

    from agentkernel.pipeline.consumer.loop import ConsumerLoop

logger = logging.getLogger(__name__)

#: Pause after a poll that came back empty at once (a short poll), so the loop does not spin.
IDLE_POLL_SECONDS = 1.0
#: Longest a ``poll`` is expected to wait, in seconds (the SQS long-poll ceiling).
POLL_WAIT_SECONDS = 20.0


class GuideShaped(Protocol):
    """What is read of a guide-shaped consumer class (a :class:`~.base.QueueConsumer`
    subclass): its class methods and two settings."""

    __name__: str
    max_receive_count: int
    num_consumers: int
    process_message: Callable[..., Any]
    on_permanent_failure: Callable[..., Any]

    def poll(self) -> list[Any]: ...

    def delete_message(self, record: Any) -> None: ...

    def poll_batch_size(self) -> int: ...


class RecordConsumer(BlockingConsumer):
    """A transport consumer over a guide-shaped consumer class's ``poll``/``delete_message``.

    ``poll`` decides how many records a fetch returns and how long it waits; after an empty
    poll that returned at once, ``fetch`` pauses so a short-polling ``poll`` does not spin.
    ``nack`` is the base no-op: a record comes back when its lease (the SQS visibility
    timeout) runs out, as the guide's consumers have it.
    """

    #: ``poll`` takes no wait: it decides its own (a long poll), so fetches are not sliced.
    fetch_wait_slice_seconds = POLL_WAIT_SECONDS

    def __init__(self, owner: GuideShaped) -> None:
        self._owner = owner

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        started = time.monotonic()
        records = list(self._owner.poll() or [])
        if not records and (idle := min(wait_seconds, IDLE_POLL_SECONDS)) > 0:
            time.sleep(max(idle - (time.monotonic() - started), 0.0))
        return [record_message(record) for record in records]

    def ack(self, message: QueueMessage) -> None:
        self._owner.delete_message(message.native)


def record_message(record: Any) -> QueueMessage:
    """The envelope the loop handles a raw ``record`` in (the record is its ``native``).

    Reads SQS records as boto3 returns them and as a Lambda event carries them; an envelope is
    passed through. Of anything else only the record itself is kept (one delivery, no group).
    """
    if isinstance(record, QueueMessage):
        return record.model_copy(update={"native": record})
    if not isinstance(record, Mapping):
        return QueueMessage(body="", native=record)
    system = _mapping(record.get("Attributes", record.get("attributes")))
    custom = _mapping(record.get("MessageAttributes", record.get("messageAttributes")))
    group = system.get("MessageGroupId")
    message_id = record.get("MessageId", record.get("messageId"))
    body = record.get("Body", record.get("body"))
    return QueueMessage(
        body=body if isinstance(body, str) else "",
        attributes=_string_attributes(custom),
        group_id=group if isinstance(group, str) else None,
        receive_count=_receive_count(system.get("ApproximateReceiveCount"), message_id),
        message_id=str(message_id) if message_id is not None else None,
        native=record,
    )


def on_record(fn: Callable[[Any], Any]) -> Callable[[QueueMessage], Any]:
    """``fn`` (a class method over raw records) as a handler of envelopes, async if it is."""
    if is_async_callable(fn):

        async def run_async(message: QueueMessage) -> Any:
            return await fn(message.native)

        return run_async

    def run(message: QueueMessage) -> Any:
        return fn(message.native)

    return run


def record_loop(owner: GuideShaped, stop: threading.Event | None = None) -> ConsumerLoop:
    """The :class:`ConsumerLoop` that runs a guide-shaped consumer class.

    Args:
        owner: the class; its ``num_consumers`` threads each poll, and a record delivered more
            than ``max_receive_count`` times goes to ``on_permanent_failure``, then is deleted.
        stop: stops the loop once set; default the process's shutdown event.
    """
    from agentkernel.pipeline.consumer.handling import HandlingPolicy, MessageHandling
    from agentkernel.pipeline.consumer.loop import ConsumerLoop
    from agentkernel.pipeline.consumer.settings import LoopSettings

    # Class methods of a guide-shaped class: already bound, they take the record alone.
    process = cast(Callable[[Any], Any], owner.process_message)
    failure = cast(Callable[[Any], Any], owner.on_permanent_failure)
    handling = MessageHandling(
        on_record(process),
        on_record(failure),
        queue=owner.__name__,
        policy=HandlingPolicy(max_receive_count=owner.max_receive_count, lease_extension=False),
    )
    settings = LoopSettings(
        num_consumers=owner.num_consumers,
        batch_size=owner.poll_batch_size(),
        wait_seconds=POLL_WAIT_SECONDS,
    )
    return ConsumerLoop(handling, lambda: RecordConsumer(owner), settings, stop)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _string_attributes(raw: Mapping[str, Any]) -> dict[str, str]:
    """The string message attributes (for log lines: the request id); others are left out."""
    out = {}
    for name, attr in raw.items():
        value = (
            attr.get("StringValue", attr.get("stringValue")) if isinstance(attr, Mapping) else None
        )
        if isinstance(name, str) and isinstance(value, str):
            out[name] = value
    return out


def _receive_count(raw: Any, message_id: Any) -> int:
    """The record's delivery count; 1 (logged) when it is missing or not a positive number."""
    try:
        count = int(raw)
    except (TypeError, ValueError):
        count = 0
    if count >= 1:
        return count
    if raw is not None:
        logger.warning(
            "record %s has no readable receive count (%r); counted as 1", message_id, raw
        )
    return 1
