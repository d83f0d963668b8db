"""The async transport API called from plain code: threads, Lambda, the CLI and test suites.

:class:`SyncTransport` and :class:`SyncConsumer` run each call on an event loop and wait for it:
the consumer's own loop when its client is bound to one, else one loop thread shared by every
face of the process. Code on an event loop awaits the transport instead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from agentkernel.pipeline.runtime.event_loop import LoopThread
from agentkernel.pipeline.transport.base import QueueTransport, TransportConsumer
from agentkernel.pipeline.transport.blocking import adapt, adapt_consumer
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

logger = logging.getLogger(__name__)
T = TypeVar("T")

_shared: LoopThread | None = None
_shared_lock = threading.Lock()


def _face_loop() -> LoopThread:
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = LoopThread("transport-sync-face")
        return _shared


def _log_failure(future: Future[None]) -> None:
    if not future.cancelled() and (exc := future.exception()) is not None:
        logger.warning("an ack queued on its consumer's loop failed: %r", exc)


def run_for(consumer: TransportConsumer, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``, a call of ``consumer``, from a plain thread, and return its result."""
    return (consumer.home_loop() or _face_loop()).run(coro)


class SyncConsumer:
    """A :class:`TransportConsumer` with plain methods; safe to call from any thread."""

    def __init__(self, consumer: Any) -> None:
        self.consumer: TransportConsumer = adapt_consumer(consumer)
        self._home = self.consumer.home_loop()  # its acks are queued there, not waited for
        self._loop = self._home or _face_loop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.consumer, name)  # lease_seconds and what a broker offers beside

    @property
    def async_api(self) -> TransportConsumer:
        """The consumer behind the face: what a consumer loop given this face awaits."""
        return self.consumer

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro)

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        """See :meth:`TransportConsumer.fetch`."""
        return self._run(self.consumer.fetch(batch_size, wait_seconds))

    def ack(self, message: QueueMessage) -> None:
        """See :meth:`TransportConsumer.ack`.

        A consumer bound to a loop of its own (NATS) is not waited for, as a sync client's ack
        is not: the ack is queued on that loop, which runs it before any later call made
        through this face, and a failure is logged (the message then comes again). Waiting
        cost two thread wake-ups per message, most of an ack's time.
        """
        if self._home is None:
            self._run(self.consumer.ack(message))
        else:
            self._loop.submit(self.consumer.ack(message)).add_done_callback(_log_failure)

    def nack(self, message: QueueMessage, delay_seconds: float | None = None) -> bool:
        """See :meth:`TransportConsumer.nack`."""
        return self._run(self.consumer.nack(message, delay_seconds))

    def dead_letter(self, message: QueueMessage) -> None:
        """See :meth:`TransportConsumer.dead_letter`."""
        self._run(self.consumer.dead_letter(message))

    def extend_lease(self, message: QueueMessage) -> None:
        """See :meth:`TransportConsumer.extend_lease`."""
        self._run(self.consumer.extend_lease(message))

    def stop_fetching(self) -> list[QueueMessage]:
        """See :meth:`TransportConsumer.stop_fetching`."""
        return self._run(self.consumer.stop_fetching())

    def close(self) -> None:
        """See :meth:`TransportConsumer.close`."""
        self._run(self.consumer.close())


class SyncTransport:
    """A :class:`QueueTransport` with a plain ``send``; safe to call from any thread."""

    def __init__(self, transport: Any) -> None:
        #: The transport as given (a broker's own methods and state, for tests).
        self.broker = transport
        #: The async API over it.
        self.transport: QueueTransport = adapt(transport)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)  # ping, check_queues, close, depth, ...

    @property
    def async_api(self) -> QueueTransport:
        """The transport behind the face: what the pipeline given this face awaits."""
        return self.transport

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        """See :meth:`QueueTransport.send`."""
        return (self.transport.home_loop() or _face_loop()).run(self.transport.send(queue, message))

    def create_consumer(self, queue: QueueName) -> SyncConsumer:
        """See :meth:`QueueTransport.create_consumer`."""
        return SyncConsumer(self.transport.create_consumer(queue))
