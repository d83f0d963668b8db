"""What a queue consumer is: the :class:`QueueConsumer` base its components subclass."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, cast

from agentkernel.pipeline.wire.envelope import QueueMessage


class QueueConsumer(ABC):
    """A component that consumes one queue (Agent Runner, response handler, Lambda consumers).

    Subclasses say what to do with a message and what to do when it keeps failing. The pipeline's
    own components take :class:`QueueMessage` envelopes and are driven by their own loops.

    A subclass written to the queue-mode guide instead gives all four methods as class methods
    over the broker's raw records: ``poll()`` returns one batch, ``delete_message(record)``
    removes a handled one, and :meth:`run` drives them on a
    :class:`~agentkernel.pipeline.consumer.loop.ConsumerLoop` with ``num_consumers`` threads
    (see :mod:`agentkernel.pipeline.consumer.records`). Push-driven consumers (an SQS event
    source mapping on Lambda) leave ``poll`` and ``delete_message`` unimplemented.
    """

    #: Deliveries of a record before ``on_permanent_failure`` runs instead (guide-shaped).
    max_receive_count: int = 3
    #: Polling threads :meth:`run` starts (guide-shaped).
    num_consumers: int = 1

    @abstractmethod
    def process_message(self, message: QueueMessage) -> Any:
        """Handle one message (may be ``async``); raising makes it be delivered again."""

    @abstractmethod
    def on_permanent_failure(self, message: QueueMessage) -> Any:
        """Answer the caller of a message that exhausted its deliveries (may be ``async``)."""

    @classmethod
    def poll(cls) -> list[Any]:
        """Receive one batch of raw records (a bounded wait); not available on push-driven
        consumers."""
        raise NotImplementedError(f"{cls.__name__} does not poll")

    @classmethod
    def delete_message(cls, record: Any) -> None:
        """Remove a handled record from the broker; not available on push-driven consumers."""
        raise NotImplementedError(f"{cls.__name__} does not delete messages")

    @classmethod
    def poll_batch_size(cls) -> int:
        """The most records one ``poll`` returns (it sizes the loop's places in flight)."""
        return 1

    @classmethod
    def run(cls) -> None:
        """Process entry of a guide-shaped subclass: poll on ``num_consumers`` threads until
        SIGTERM, then finish the records in hand and exit 0 (1 after a thread crashed).

        Raises:
            ValueError: ``num_consumers`` or ``max_receive_count`` is below 1.
        """
        from agentkernel.pipeline.consumer.records import GuideShaped, record_loop
        from agentkernel.pipeline.runtime.thread_runner import ThreadRunner

        cls.check_settings()
        loop = record_loop(cast(GuideShaped, cls))  # its class methods are what is read
        ThreadRunner.install_signal_handlers()
        loop.run()

    @classmethod
    def check_settings(cls) -> None:
        """Refuse settings :meth:`run` cannot work with, naming the class and the value.

        Raises:
            ValueError: ``num_consumers`` or ``max_receive_count`` is not a whole number >= 1.
        """
        for name in ("num_consumers", "max_receive_count"):
            value = getattr(cls, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{cls.__name__}.{name} must be a whole number >= 1, got {value!r}"
                )
