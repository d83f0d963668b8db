"""The transport contract: what a queue broker must do for the pipeline.

A :class:`QueueTransport` sends messages and creates consumers; a :class:`TransportConsumer`
fetches, acknowledges and releases them. Every transport gives the same six guarantees
(per-group FIFO with one message in flight per group, bounded redelivery with an exact
``receive_count``, publish-time dedup, byte-identical attributes, batch fetch with a bounded
wait, INPUT/OUTPUT isolation) or declares on its contract test which one its broker cannot give.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import warnings
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from agentkernel.core.config.queues import QueuesConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.core.lazy import lazy_getattr
from agentkernel.pipeline.runtime.event_loop import LoopThread
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

logger = logging.getLogger(__name__)

#: Upstream's path of the factory, ``transport.base.QueueTransportFactory``, looked up by name on
#: first use: the factory imports every transport, so no transport may import it (see
#: .importlinter, where this is the one lookup allowed around the layers).
__getattr__ = lazy_getattr(
    __name__, {"QueueTransportFactory": "agentkernel.pipeline.transport.factory"}
)


class TransportConsumer(ABC):
    """Receives messages from one queue: the pipeline's one consumer API, async throughout.

    ``fetch`` is only awaited by one task at a time, but ``ack``, ``nack``, ``dead_letter`` and
    ``extend_lease`` may be awaited by other tasks while a fetch waits (a runner keeps many turns
    in flight and settles each one as it finishes). Fetching again while earlier messages are
    still unacknowledged is always allowed.

    A consumer written as upstream's guide describes it, with plain ``def`` methods, is adapted
    where it enters the pipeline (:func:`agentkernel.pipeline.transport.blocking.adapt_consumer`):
    its fetches run on a thread of its own and its other calls on worker threads.
    """

    @abstractmethod
    async def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        """Return up to ``batch_size`` messages, waiting at most ``wait_seconds`` for the first.

        Returns fewer (possibly none) rather than waiting past ``wait_seconds``.
        """

    @abstractmethod
    async def ack(self, message: QueueMessage) -> None:
        """Remove the message for good (processed, or handled as a permanent failure)."""

    async def nack(self, message: QueueMessage, delay_seconds: float | None = None) -> bool:
        """Give the message back for redelivery, after about ``delay_seconds`` when given.

        The default lets the lease run out, and cannot delay.

        Returns:
            ``False`` when a delay was asked for and the broker cannot schedule one: nothing
            happened, and the caller keeps the message (and its lease) for the delay, then
            nacks it without one. ``True`` otherwise.
        """
        return not delay_seconds

    async def dead_letter(self, message: QueueMessage) -> None:
        """Final disposition after the permanent-failure hook ran; default: ``ack``."""
        await self.ack(message)

    @property
    def lease_seconds(self) -> float | None:
        """Seconds a fetched message stays invisible, or ``None`` when leases do not expire."""
        return None

    async def extend_lease(self, message: QueueMessage) -> None:  # noqa: B027 - optional hook
        """Restart the message's lease (visibility timeout, ack wait) while work goes on."""

    async def stop_fetching(self) -> list[QueueMessage]:
        """No fetch will follow (the loop drains): stop asking the broker for messages now.

        Returns:
            what the broker had already delivered here and no fetch handed out (requests still
            open when fetching stopped, answered before they could be cancelled). The caller
            runs them in its drain: giving them back would cost each one a delivery. The drain
            calls it again while it waits for the messages in hand, and runs what it returns
            then too (those whose turn before them has settled since).
        """
        return []

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release broker resources (subscriptions, group membership, threads). Idempotent."""

    def home_loop(self) -> LoopThread | None:
        """The event-loop thread this consumer's client is bound to, or ``None`` (the default).

        A consumer loop awaits a consumer that has one on that loop only, and handles its
        messages there, so a message crosses no thread between its fetch and its ack.
        """
        return None

    # -- upstream's names, for one release ------------------------------------------------

    async def fetch_async(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        """Deprecated: ``fetch`` is async now."""
        deprecated("TransportConsumer.fetch_async", "fetch")
        if not inspect.iscoroutinefunction(self.fetch):  # a plain fetch: on a worker thread
            return await asyncio.to_thread(self.fetch, batch_size, wait_seconds)  # type: ignore[arg-type]
        return await self.fetch(batch_size, wait_seconds)

    async def nack_later(self, message: QueueMessage, delay_seconds: float) -> bool:
        """Deprecated: ``nack(message, delay_seconds)``."""
        deprecated("TransportConsumer.nack_later", "nack(message, delay_seconds)")
        if not inspect.iscoroutinefunction(self.nack):
            return False  # a plain consumer's nack takes no delay: the caller keeps the message
        return await self.nack(message, delay_seconds)


class QueueTransport(ABC):
    """The send side of a broker, shared by all tasks and threads of a process.

    ``send`` is async; the lifecycle calls (``create_consumer``, ``ping``, ``check_queues``,
    ``close``) are plain calls made at start, from ``/ready`` and at exit. A transport written
    with a plain ``def send`` (upstream's guide) is adapted where it enters the pipeline
    (:func:`agentkernel.pipeline.transport.blocking.adapt`).
    """

    #: The queues live in this process: nothing outside it can reach them and they die with it
    #: (its queued messages must be handled before exit); it then also offers ``depth(queue)``,
    #: ``in_flight(queue)`` and ``purge(queue)``.
    queues_in_process: ClassVar[bool] = False

    @abstractmethod
    async def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        """Publish ``message`` on ``queue``. Cancelling the call may leave the message sent.

        Returns:
            the broker's message id, or ``None`` when the message was dropped as a duplicate.

        Raises:
            MessageRejectedError: the message breaks a broker limit; nothing was sent.
            TransportError: the broker did not accept the message.
        """

    def create_consumer(self, queue: QueueName) -> TransportConsumer:
        """Create a consumer of ``queue`` for one consumer task."""
        raise NotImplementedError(f"{type(self).__name__} cannot consume")

    def check_consumer_capacity(self, queue: QueueName, num_consumers: int) -> None:  # noqa: B027
        """Warn (never raise) when the broker cannot serve ``num_consumers`` in parallel."""

    def ping(self) -> None:  # noqa: B027 - optional hook
        """Raise ``TransportError`` when the broker is unreachable (used by ``GET /ready``)."""

    def check_queues(self, queues: tuple[QueueName, ...]) -> None:
        """Start-up check of the queues this process uses; default :meth:`ping`.

        Raises:
            AKConfigError: one of ``queues`` does not exist (the message names it).
            TransportError: the broker is unreachable.
        """
        self.ping()

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the transport's own connections."""

    def home_loop(self) -> LoopThread | None:
        """The event-loop thread this transport's client is bound to, or ``None``: plain code
        (:mod:`.sync_face`) runs a ``send`` there, with no second hop."""
        return None

    async def send_async(self, queue: QueueName, message: QueueMessage) -> str | None:
        """Deprecated: ``send`` is async now."""
        deprecated("QueueTransport.send_async", "send")
        if not inspect.iscoroutinefunction(self.send):  # a plain send: on a worker thread
            return await asyncio.to_thread(self.send, queue, message)  # type: ignore[arg-type]
        return await self.send(queue, message)


def deprecated(old: str, new: str) -> None:
    """Warn once per call site that ``old`` goes in the next release."""
    warnings.warn(
        f"{old} is deprecated and goes in the next release; use {new}",
        DeprecationWarning,
        stacklevel=3,
    )


def require_block(block: QueuesConfig, name: str) -> Any:
    """Return ``execution.queues.<name>`` or fail with an error naming the missing block."""
    value = getattr(block, name)
    if value is None:
        raise AKConfigError(
            f"execution.queues.{name}: block is required when execution.queues.type is '{name}'"
        )
    return value


def require_queue_urls(block: QueuesConfig, kind: str) -> tuple[str, str]:
    """Return the INPUT and OUTPUT queue URLs, or fail naming the one that is missing."""
    for name in ("input", "output"):
        if not getattr(block, name).url:
            raise AKConfigError(
                f"execution.queues.{name}.url: required when execution.queues.type is '{kind}'"
            )
    return block.input.url or "", block.output.url or ""
