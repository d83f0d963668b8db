"""Transports with blocking clients, and the one adapter that puts them behind the async API.

boto3, confluent-kafka, redis-py and sync psycopg block the calling thread, and so does a
transport written as upstream's guide describes one (plain ``def send``, ``def fetch``, ...,
``fetch_wait_slice_seconds``). Such a transport subclasses :class:`BlockingTransport` (or
upstream's ``QueueTransport`` with plain methods); :func:`adapt` and :func:`adapt_consumer` wrap
it once, where it enters the pipeline, and the pipeline sees only
:class:`~agentkernel.pipeline.transport.base.QueueTransport`'s async methods:

- a consumer's fetches run on a thread of its own (Kafka needs one client per thread), in
  slices of ``fetch_wait_slice_seconds`` (about a second unless declared): a fetch cannot be
  interrupted, so a cancelled call leaves at most one slice running, whose messages the next
  fetch or ``stop_fetching`` hands out;
- its other calls and every ``send`` run on worker threads, or inline where the transport
  declares that they never wait (``nonblocking``: ``send``, and ``ack``, ``nack``,
  ``nack_later``, ``dead_letter`` and ``extend_lease`` of its consumers).

A client bound to an event loop of its own is written against the async API instead (NATS is).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import math
import time
from abc import abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from agentkernel.core.blocking import call
from agentkernel.pipeline.transport.base import QueueTransport, TransportConsumer, deprecated
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

if TYPE_CHECKING:  # to a type checker they are not the async classes: never awaited
    from abc import ABC as _ConsumerBase
    from abc import ABC as _TransportBase
else:  # at run time they are, as upstream's sync transports are (isinstance, dotted paths)
    from agentkernel.pipeline.transport.base import QueueTransport as _TransportBase
    from agentkernel.pipeline.transport.base import TransportConsumer as _ConsumerBase

#: Longest wait one blocking fetch is asked for, unless its consumer declares a slice.
DEFAULT_FETCH_SLICE_SECONDS = 1.0


class BlockingConsumer(_ConsumerBase):
    """A consumer with blocking methods; :func:`adapt_consumer` puts it behind the async API.

    It is a :class:`TransportConsumer` by class, as upstream's sync consumers are, but its
    methods are plain: never await one, adapt it.

    ``fetch`` runs on the consumer's own thread; ``ack``, ``nack``, ``nack_later``,
    ``dead_letter`` and ``extend_lease`` run on other threads, maybe while a fetch is blocked,
    so they must be thread-safe.
    """

    #: ``ack``/``nack``/``dead_letter`` never wait on I/O: they are called inline.
    nonblocking: ClassVar[bool] = False
    #: Longest wait a single fetch is asked for, in seconds (``None``: about a second, so a
    #: stopping loop is noticed); a broker that bills every receive call (SQS) declares more.
    fetch_wait_slice_seconds: float | None = None

    @abstractmethod
    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        """Return up to ``batch_size`` messages, waiting at most ``wait_seconds`` for the first."""

    @abstractmethod
    def ack(self, message: QueueMessage) -> None:
        """Remove the message for good."""

    def nack(self, message: QueueMessage) -> None:
        """Give the message back for redelivery; default: let the lease run out."""

    def nack_later(self, message: QueueMessage, delay_seconds: float) -> bool:
        """Give the message back in about ``delay_seconds``; ``False`` when the broker cannot."""
        return False

    def dead_letter(self, message: QueueMessage) -> None:
        """Final disposition after the permanent-failure hook ran; default: ``ack``."""
        self.ack(message)

    @property
    def lease_seconds(self) -> float | None:
        """Seconds a fetched message stays invisible, or ``None`` when leases do not expire."""
        return None

    def extend_lease(self, message: QueueMessage) -> None:
        """Restart the message's lease while work goes on."""

    def stop_fetching(self) -> list[QueueMessage]:
        """No fetch will follow: see :meth:`TransportConsumer.stop_fetching`."""
        return []

    async def fetch_async(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        """Not offered: a blocking consumer fetches on a thread (see :func:`adapt_consumer`)."""
        raise NotImplementedError(f"{type(self).__name__} fetches on threads only")

    def close(self) -> None:
        """Release broker resources. Idempotent."""


class BlockingTransport(_TransportBase):
    """The send side of a broker with a blocking client (``send`` is thread-safe).

    A :class:`QueueTransport` by class, as upstream's sync transports are, so ``isinstance``
    checks and dotted paths keep working; never await its methods, :func:`adapt` it.
    """

    #: ``send`` never waits on I/O: it is called inline.
    nonblocking: ClassVar[bool] = False
    #: See :attr:`QueueTransport.queues_in_process`.
    queues_in_process: ClassVar[bool] = False

    @abstractmethod
    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        """Publish ``message`` on ``queue``; see :meth:`QueueTransport.send`."""

    async def send_async(self, queue: QueueName, message: QueueMessage) -> str | None:
        """Deprecated: :meth:`send` from an event loop (inline when ``nonblocking``, else on a
        worker thread); await ``adapt(transport).send`` instead."""
        deprecated("BlockingTransport.send_async", "adapt(transport).send")
        return await call(self.nonblocking, self.send, queue, message)

    def create_consumer(self, queue: QueueName) -> Any:
        """Create a (blocking) consumer of ``queue``."""
        raise NotImplementedError(f"{type(self).__name__} cannot consume")

    def check_consumer_capacity(self, queue: QueueName, num_consumers: int) -> None:
        """Warn (never raise) when the broker cannot serve ``num_consumers`` in parallel."""

    def ping(self) -> None:
        """Raise ``TransportError`` when the broker is unreachable."""

    def check_queues(self, queues: tuple[QueueName, ...]) -> None:
        """Start-up check of the queues this process uses; default :meth:`ping`."""
        self.ping()

    def close(self) -> None:
        """Release the transport's own connections."""


#: What the factory makes and the pipeline's constructors take: either kind of transport.
AnyTransport = QueueTransport | BlockingTransport
AnyConsumer = TransportConsumer | BlockingConsumer


def is_async(transport: object) -> bool:
    """Whether ``transport`` already speaks the async API (its ``send`` is a coroutine)."""
    return inspect.iscoroutinefunction(getattr(transport, "send", None))


def adapt(transport: Any) -> QueueTransport:
    """``transport`` behind the async API; an async transport is returned as it is, and a sync
    face (:mod:`.sync_face`) gives the transport behind it."""
    if (behind := getattr(transport, "async_api", None)) is not None:
        return behind  # type: ignore[no-any-return]
    if isinstance(transport, QueueTransport) and is_async(transport):
        return transport
    return AdaptedTransport(transport)


def adapt_consumer(consumer: Any) -> TransportConsumer:
    """``consumer`` behind the async API; an async consumer is returned as it is, and a sync
    face gives the consumer behind it."""
    if (behind := getattr(consumer, "async_api", None)) is not None:
        return behind  # type: ignore[no-any-return]
    if isinstance(consumer, TransportConsumer) and inspect.iscoroutinefunction(consumer.fetch):
        return consumer
    return AdaptedConsumer(consumer)


def _own(obj: Any, name: str, base: type) -> Any:
    """``obj.name`` when ``obj``'s class defines it as a plain method (not inherited from the
    async ``base``, whose defaults would await the plain methods), else ``None``."""
    method = getattr(obj, name, None)
    if method is None or getattr(type(obj), name, None) is getattr(base, name, None):
        return None
    return None if inspect.iscoroutinefunction(method) else method


class AdaptedTransport(QueueTransport):
    """A blocking transport behind the async API; see the module's docstring."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.queues_in_process = bool(getattr(inner, "queues_in_process", False))  # type: ignore[misc]
        self._inline = bool(getattr(inner, "nonblocking", False))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # what a broker offers beside the contract

    async def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        if self._inline:
            return self.inner.send(queue, message)  # type: ignore[no-any-return]
        return await asyncio.to_thread(self.inner.send, queue, message)

    def create_consumer(self, queue: QueueName) -> TransportConsumer:
        return adapt_consumer(self.inner.create_consumer(queue))

    def check_consumer_capacity(self, queue: QueueName, num_consumers: int) -> None:
        if (check := _own(self.inner, "check_consumer_capacity", QueueTransport)) is not None:
            check(queue, num_consumers)

    def ping(self) -> None:
        if (ping := _own(self.inner, "ping", QueueTransport)) is not None:
            ping()

    def check_queues(self, queues: tuple[QueueName, ...]) -> None:
        if (check := _own(self.inner, "check_queues", QueueTransport)) is not None:
            check(queues)
        else:
            self.ping()

    def close(self) -> None:
        if (close := _own(self.inner, "close", QueueTransport)) is not None:
            close()


class AdaptedConsumer(TransportConsumer):
    """A blocking consumer behind the async API; see the module's docstring."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._inline = bool(getattr(inner, "nonblocking", False))
        self._slice = getattr(inner, "fetch_wait_slice_seconds", None)
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: concurrent.futures.Future[list[QueueMessage]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def lease_seconds(self) -> float | None:
        return getattr(self.inner, "lease_seconds", None)

    async def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        wait = max(wait_seconds, 0.0)
        slices = max(math.ceil(wait / (self._slice or DEFAULT_FETCH_SLICE_SECONDS)), 1)
        deadline = time.monotonic() + wait
        for _ in range(slices):  # a cancelled call leaves at most one slice running
            if self._pending is None:  # else: the fetch of a cancelled call, not handed out yet
                if self._thread is None:
                    self._thread = concurrent.futures.ThreadPoolExecutor(1, "fetch")
                self._pending = self._thread.submit(self.inner.fetch, batch_size, wait / slices)
            messages = await self._collect()
            if messages or time.monotonic() >= deadline:
                break
        return messages

    async def _collect(self) -> list[QueueMessage]:
        """The result of the fetch in progress; kept for the next call if this one is cancelled
        before the fetch ended."""
        pending = self._pending
        assert pending is not None
        try:
            return await asyncio.wrap_future(pending)
        finally:
            if pending.done():
                self._pending = None

    async def ack(self, message: QueueMessage) -> None:
        await self._call(self.inner.ack, message)

    async def nack(self, message: QueueMessage, delay_seconds: float | None = None) -> bool:
        if delay_seconds:
            later = _own(self.inner, "nack_later", TransportConsumer)
            return later is not None and bool(await self._call(later, message, delay_seconds))
        if (nack := _own(self.inner, "nack", TransportConsumer)) is not None:
            await self._call(nack, message)
        return True

    async def dead_letter(self, message: QueueMessage) -> None:
        if (dead_letter := _own(self.inner, "dead_letter", TransportConsumer)) is None:
            dead_letter = self.inner.ack
        await self._call(dead_letter, message)

    async def extend_lease(self, message: QueueMessage) -> None:
        if (extend := _own(self.inner, "extend_lease", TransportConsumer)) is not None:
            await self._call(extend, message)

    async def stop_fetching(self) -> list[QueueMessage]:
        late: list[QueueMessage] = []
        if self._pending is not None:  # a fetch whose caller went away: its messages are here
            with contextlib.suppress(Exception):  # a failed fetch returned nothing
                late = await self._collect()
        if (stop := _own(self.inner, "stop_fetching", TransportConsumer)) is not None:
            late += await asyncio.to_thread(stop)
        return late

    async def close(self) -> None:
        if (close := _own(self.inner, "close", TransportConsumer)) is not None:
            await asyncio.to_thread(close)
        if self._thread is not None:
            self._thread.shutdown(wait=False)

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await call(self._inline, fn, *args)
