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
import logging
import math
import queue
import threading
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

_SETTLE = ("fetch", "ack", "nack", "dead_letter", "extend_lease", "stop_fetching", "close")
#: Pause after a fetch that came back empty at once (it may; the loop must not spin on it).
EMPTY_FETCH_PAUSE_SECONDS = 0.05
#: Longest a drain waits for a fetch slice still running, beyond the slice itself, in seconds.
LATE_SLICE_MARGIN_SECONDS = 5.0

logger = logging.getLogger(__name__)

#: Longest wait one blocking fetch is asked for, unless its consumer declares a slice.
DEFAULT_SLICE_SECONDS = 1.0


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
    face gives the consumer behind it. One that mixes plain and ``async`` methods is adapted:
    each of its methods is then called the way it was written."""
    if (behind := getattr(consumer, "async_api", None)) is not None:
        return behind  # type: ignore[no-any-return]
    if isinstance(consumer, TransportConsumer) and all(
        inspect.iscoroutinefunction(getattr(consumer, name)) for name in _SETTLE
    ):
        return consumer
    return AdaptedConsumer(consumer)


def _own(obj: Any, name: str, *bases: type) -> Any:
    """``obj.name`` unless it is one of the ``bases``' defaults, else ``None``: the async base's
    would await plain methods, and the blocking base's do nothing the adapter must call."""
    defined = getattr(type(obj), name, None)
    if any(defined is getattr(base, name, None) for base in bases):
        return None
    return getattr(obj, name, None)


class AdaptedTransport(QueueTransport):
    """A blocking transport behind the async API; see the module's docstring."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.queues_in_process = bool(getattr(inner, "queues_in_process", False))  # type: ignore[misc]
        self._inline = bool(getattr(inner, "nonblocking", False))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # what a broker offers beside the contract

    def _hook(self, name: str) -> Any:
        return _own(self.inner, name, QueueTransport, BlockingTransport)

    async def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        if self._inline:
            return self.inner.send(queue, message)  # type: ignore[no-any-return]
        return await asyncio.to_thread(self.inner.send, queue, message)

    def create_consumer(self, queue: QueueName) -> TransportConsumer:
        return adapt_consumer(self.inner.create_consumer(queue))

    def check_consumer_capacity(self, queue: QueueName, num_consumers: int) -> None:
        if (check := self._hook("check_consumer_capacity")) is not None:
            check(queue, num_consumers)

    def ping(self) -> None:
        if (ping := self._hook("ping")) is not None:
            ping()

    def check_queues(self, queues: tuple[QueueName, ...]) -> None:
        if (check := self._hook("check_queues")) is not None:
            check(queues)
        else:
            self.ping()

    def close(self) -> None:
        if (close := self._hook("close")) is not None:
            close()


class AdaptedConsumer(TransportConsumer):
    """A blocking consumer behind the async API; see the module's docstring."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._inline = bool(getattr(inner, "nonblocking", False))
        self._slice = getattr(inner, "fetch_wait_slice_seconds", None) or DEFAULT_SLICE_SECONDS
        self._thread: FetchThread | None = None
        self._orphans: list[concurrent.futures.Future[Any]] = []  # of cancelled fetches

        # The hooks it defines itself, looked up once (None: the default, nothing to call).
        def hook(name: str) -> Any:
            return _own(inner, name, TransportConsumer, BlockingConsumer)

        self._nack, self._nack_later = hook("nack"), hook("nack_later")
        self._dead_letter = hook("dead_letter") or inner.ack
        self._extend, self._stop, self._close = (
            hook("extend_lease"),
            hook("stop_fetching"),
            hook("close"),
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def lease_seconds(self) -> float | None:
        return getattr(self.inner, "lease_seconds", None)

    async def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        if late := self._finished_orphans():
            return late
        if inspect.iscoroutinefunction(self.inner.fetch):  # written async among plain methods
            return _messages(await self.inner.fetch(batch_size, wait_seconds))
        if self._inline and (ready := _messages(self.inner.fetch(batch_size, 0.0))):
            return ready  # queues in this process: what is there now, with no thread hop
        wait = max(wait_seconds, 0.0)
        slices = max(math.ceil(wait / self._slice), 1)
        deadline = time.monotonic() + wait
        for _ in range(slices):  # a cancelled call leaves at most one slice running
            began = time.monotonic()
            messages = await self._slice_of(batch_size, wait / slices)
            if messages or time.monotonic() >= deadline:
                return messages
            if time.monotonic() - began < EMPTY_FETCH_PAUSE_SECONDS:  # it did not wait: no spin
                await asyncio.sleep(EMPTY_FETCH_PAUSE_SECONDS)
        return []

    async def _slice_of(self, batch_size: int, wait: float) -> list[QueueMessage]:
        """One blocking fetch on this consumer's thread; cancelled, its result is kept."""
        if self._thread is None:
            self._thread = FetchThread(f"fetch-{type(self.inner).__name__}")
        future = self._thread.submit(self.inner.fetch, batch_size, wait)
        try:
            result = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if not future.cancelled():  # running already: its messages come back later
                self._orphans.append(future)
            raise
        return _messages(await result if inspect.isawaitable(result) else result)

    def _finished_orphans(self) -> list[QueueMessage]:
        """Messages of cancelled fetches that have ended since."""
        late: list[QueueMessage] = []
        for future in [f for f in self._orphans if f.done()]:
            self._orphans.remove(future)
            if future.exception() is None:
                late += _messages(future.result())
        return late

    async def ack(self, message: QueueMessage) -> None:
        await self._call(self.inner.ack, message)

    async def nack(self, message: QueueMessage, delay_seconds: float | None = None) -> bool:
        if delay_seconds:
            later = self._nack_later
            return later is not None and bool(await self._call(later, message, delay_seconds))
        if self._nack is not None:
            await self._call(self._nack, message)
        return True

    async def dead_letter(self, message: QueueMessage) -> None:
        await self._call(self._dead_letter, message)

    async def extend_lease(self, message: QueueMessage) -> None:
        if self._extend is not None:
            await self._call(self._extend, message)

    async def stop_fetching(self) -> list[QueueMessage]:
        """What cancelled fetches brought (waiting at most one slice and a margin for them;
        what comes later is handed back), then the consumer's own ``stop_fetching``."""
        orphans, self._orphans = self._orphans, []
        if orphans:
            await asyncio.wait(
                [asyncio.wrap_future(f) for f in orphans],
                timeout=self._slice + LATE_SLICE_MARGIN_SECONDS,
            )
        late: list[QueueMessage] = []
        for future in orphans:
            if not future.done():
                logger.warning("a fetch outlasted its slice; what it brings is handed back")
                future.add_done_callback(self._hand_back)
            elif future.exception() is None:
                late += _messages(future.result())
        if self._stop is not None:
            late += _messages(await self._call(self._stop, blocking=True))
        return late

    def _hand_back(self, future: concurrent.futures.Future[Any]) -> None:
        """On the fetch thread: give back what a fetch brought after the drain gave up on it."""
        if future.exception() is None:
            for message in _messages(future.result()):
                if self._nack is not None and not inspect.iscoroutinefunction(self._nack):
                    with contextlib.suppress(Exception):
                        self._nack(message)

    async def close(self) -> None:
        try:
            if self._close is not None:
                await self._call(self._close, blocking=True)
        finally:
            if self._thread is not None:
                self._thread.stop()

    async def _call(self, fn: Any, *args: Any, blocking: bool = False) -> Any:
        """``fn(*args)`` the way it was written: awaited when ``async``, else inline when the
        consumer is ``nonblocking`` (and ``blocking`` is not set), else on a worker thread."""
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        result = await call(self._inline and not blocking, fn, *args)
        return await result if inspect.isawaitable(result) else result


def _messages(got: Any) -> list[QueueMessage]:
    """A fetch's result as a list (``None`` from a guide-style fetch means none)."""
    return list(got or ())


class FetchThread:
    """One daemon thread that runs a consumer's fetches in order: a fetch that never returns
    does not keep the process from exiting (a pool's threads are joined at exit)."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._calls.put((future, fn, args))
        return future

    def stop(self) -> None:
        self._calls.put(None)

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            future, fn, args = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # handed to the awaiting task
                    future.set_exception(exc)
