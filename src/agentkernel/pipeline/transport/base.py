"""The transport contract: what a queue broker must do for the pipeline.

A :class:`QueueTransport` sends messages and creates consumers; a :class:`TransportConsumer`
fetches, acknowledges and releases them. Every transport gives the same six guarantees
(per-group FIFO with one message in flight per group, bounded redelivery with an exact
``receive_count``, publish-time dedup, byte-identical attributes, batch fetch with a bounded
wait, INPUT/OUTPUT isolation) or declares on its contract test which one its broker cannot give.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from agentkernel.core.blocking import call
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
    """Receives messages from one queue; one instance per consumer thread.

    ``fetch`` is only ever called by the owning thread, but ``ack``, ``nack``, ``dead_letter`` and
    ``extend_lease`` may be called from other threads while a fetch is blocked (a runner keeps
    many turns in flight and settles each one as it finishes), so they must be thread-safe.
    Fetching again while earlier messages are still unacknowledged is always allowed.
    """

    #: ``ack``/``nack``/``dead_letter`` never wait on I/O, so event-loop code may call them
    #: inline instead of on a worker thread.
    nonblocking: ClassVar[bool] = False

    #: Longest wait a single fetch should be asked for, in seconds. ``None`` lets the
    #: ConsumerLoop slice waits to about a second so it notices shutdown quickly; a broker that
    #: bills every receive call (SQS) declares a longer slice.
    fetch_wait_slice_seconds: float | None = None

    @abstractmethod
    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        """Return up to ``batch_size`` messages, waiting at most ``wait_seconds`` for the first.

        Returns fewer (possibly none) rather than blocking past the wait.
        """

    def home_loop(self) -> LoopThread | None:
        """The event-loop thread this consumer's client runs on, or ``None`` (the default).

        A consumer with one offers :meth:`fetch_async` too, and its ``ack``, ``nack``,
        ``dead_letter`` and ``extend_lease`` do not wait when called on that loop: a
        :class:`~agentkernel.pipeline.consumer.loop.ConsumerLoop` then fetches and handles
        its messages there, without a thread hop per message.
        """
        return None

    async def fetch_async(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        """:meth:`fetch` awaited on :meth:`home_loop`; only called when that is not ``None``."""
        raise NotImplementedError(f"{type(self).__name__} fetches on threads only")

    @abstractmethod
    def ack(self, message: QueueMessage) -> None:
        """Remove the message for good (processed, or handled as a permanent failure)."""

    def nack(self, message: QueueMessage) -> None:  # noqa: B027 - optional hook
        """Give the message back for redelivery; default: let the lease run out."""

    def nack_later(self, message: QueueMessage, delay_seconds: float) -> bool:
        """Give the message back for redelivery in about ``delay_seconds``, if the broker can.

        Returns:
            ``True`` when the transport scheduled the delayed redelivery itself. ``False`` (the
            default) when it cannot: the caller then keeps the message (and its lease) for the
            delay and calls :meth:`nack`.
        """
        return False

    def dead_letter(self, message: QueueMessage) -> None:
        """Final disposition after the permanent-failure hook ran; default: ``ack``."""
        self.ack(message)

    @property
    def lease_seconds(self) -> float | None:
        """Seconds a fetched message stays invisible, or ``None`` when leases do not expire."""
        return None

    def extend_lease(self, message: QueueMessage) -> None:  # noqa: B027 - optional hook
        """Restart the message's lease (visibility timeout, ack wait) while work goes on."""

    def stop_fetching(self) -> list[QueueMessage]:
        """No fetch will follow (the loop drains): stop asking the broker for messages now.

        Returns:
            what the broker had already delivered here and no fetch handed out (requests still
            open when fetching stopped, answered before they could be cancelled). The caller
            runs them in its drain: giving them back would cost each one a delivery. The drain
            calls it again while it waits for the messages in hand, and runs what it returns
            then too (those whose turn before them has settled since).
        """
        return []

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release broker resources (subscriptions, group membership, threads). Idempotent."""


class QueueTransport(ABC):
    """The send side of a broker, shared by all threads of a process (``send`` is thread-safe)."""

    #: ``send`` never waits on I/O, so event-loop code may call it inline.
    nonblocking: ClassVar[bool] = False
    #: :meth:`send_async` awaits the broker on an event loop, with no worker thread in between
    #: (the default runs ``send`` on one).
    sends_on_loop: ClassVar[bool] = False
    #: The queues live in this process: nothing outside it can reach them and they die with it
    #: (its queued messages must be handled before exit); it then also offers ``depth(queue)``,
    #: ``in_flight(queue)`` and ``purge(queue)``.
    queues_in_process: ClassVar[bool] = False

    @abstractmethod
    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        """Publish ``message`` on ``queue``.

        Returns:
            the broker's message id, or ``None`` when the message was dropped as a duplicate.

        Raises:
            MessageRejectedError: the message breaks a broker limit; nothing was sent.
            TransportError: the broker did not accept the message.
        """

    async def send_async(self, queue: QueueName, message: QueueMessage) -> str | None:
        """:meth:`send` from an event loop, with the same result and errors.

        By default ``send`` runs inline when it is ``nonblocking`` and on a worker thread
        otherwise. A transport whose client lives on an event loop of its own overrides this to
        await the publish on that loop, which saves the worker thread's hop (about 40 us of CPU
        per message on a 2-core machine). Cancelling the call may leave the message sent.
        """
        return await call(self.nonblocking, self.send, queue, message)

    def create_consumer(self, queue: QueueName) -> TransportConsumer:
        """Create a consumer of ``queue`` for one consumer thread."""
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
