"""The NATS JetStream consumer: pulls from the partitions only while a fetch asks.

See :mod:`agentkernel.pipeline.transport.nats` for the stream and partition layout. This module
holds the receiving side: how a fetch asks the partition consumers for messages without leasing
more than it asked for, and how a closing consumer gives back what it still holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentkernel.core.errors import TransportClosedError, TransportError
from agentkernel.pipeline.envelope import QueueMessage, QueueName
from agentkernel.pipeline.transport.base import TransportConsumer
from agentkernel.pipeline.transport.nats.acks import Acks, message_id
from agentkernel.pipeline.transport.nats.envelope import received_message
from agentkernel.pipeline.transport.nats.errors import CLIENT_ERRORS
from agentkernel.pipeline.transport.nats.pull import Pull

if TYPE_CHECKING:
    from agentkernel.pipeline.transport.nats import NatsTransport

logger = logging.getLogger(__name__)

#: A no-wait probe not answered within four times the usual answer time (at least this, at most
#: the maximum) targets a partition whose message is in flight elsewhere; its request stays open
#: until the fetch ends.
PROBE_GRACE_SECONDS = 0.005
MAX_PROBE_GRACE_SECONDS = 0.2
INITIAL_ANSWER_SECONDS = 0.002
#: A message received after its fetch returned waits this long for the next fetch, then is
#: given back (at most a third of ``ack_wait``).
HOLD_SECONDS = 2.0
#: Requests still open when a fetch returns stay open for the next fetch; when none comes within
#: this many seconds (the consumer is saturated or stopping), they are cancelled.
IDLE_SECONDS = 0.5
REFRESH_AFTER_SECONDS = 1.0
#: A long poll whose answer (a message or a 408) has not come this long after its expiry
#: counts as answered: its partition is asked again (see :meth:`Pull.forget_unanswered`).
LOST_ANSWER_SECONDS = 1.0
NO_WAIT_PROBE = json.dumps({"batch": 1, "no_wait": True}).encode()


class NatsConsumer(TransportConsumer):
    """Pulls from the partitions only while fetches ask for messages.

    A fetch for ``n`` messages first probes the partitions ``n`` at a time with no-wait pull
    requests: an empty partition answers "no messages" at once, a partition whose one message is
    in flight elsewhere keeps the request open, so a fetch leases about ``n`` messages, not one
    per partition. When every partition was probed and nothing came, it long-polls the empty
    ones for the rest of the wait. Every request replies to the consumer's one inbox, and a
    request still open when its fetch returns stays open: the next fetch does not ask that
    partition again, and what the request brings is kept for the next fetch (its lease restarted
    if it waited over a second). Cancelling an open request means unsubscribing the inbox, and
    a delivery crossing that unsubscribe is counted by JetStream but reaches nobody (its
    partition then stalls for ``ack_wait``), so the inbox is unsubscribed only when fetching
    stops: :meth:`stop_fetching` (a drain), no fetch for ``IDLE_SECONDS`` (a saturated consumer),
    a reconnect, or ``close``. A message kept longer than ``HOLD_SECONDS`` without a fetch, or
    when the consumer closes, is given back with ``nak``, which JetStream counts as a delivery.

    ``ack`` sends the acknowledgement and returns without waiting for the server's
    confirmation, which the next fetch (and ``close``) awaits first: acks of a batch share one
    round trip, and a fetch never probes a partition whose ack is still on its way. An ack not
    confirmed within ``ACK_TIMEOUT_SECONDS`` (a server restarting, a reconnect) is sent again
    while the message's lease lasts, so a lost ack does not hold its partition for ``ack_wait``.
    """

    def __init__(self, transport: NatsTransport, queue: QueueName) -> None:
        self._transport = transport
        self._queue = queue
        self._stream, _ = transport.streams[queue]
        transport.stream_unit(queue)  # names positions (see pipeline.position); read it now
        self._settings = transport.settings
        self._nc = transport.conn.nc
        self._loop = transport.conn.loop.loop  # a reset transport's loop is closed, not renewed
        self._next_subjects = [
            f"$JS.API.CONSUMER.MSG.NEXT.{self._stream}.{self._stream}-p{p}"
            for p in range(self._settings.partitions)
        ]
        self._held: deque[tuple[float, Any]] = deque()  # received, not yet handed out
        self._hold_limit = min(HOLD_SECONDS, self._settings.ack_wait / 3)
        self._retiring: set[asyncio.Task[None]] = set()
        self._inbox: Pull | None = None  # the inbox every request replies to, across fetches
        self._idle_timer: asyncio.TimerHandle | None = None
        self._release_timer: asyncio.TimerHandle | None = None
        self._changed: asyncio.Event = transport.run(_new_event())
        self._cursor = 0
        self._empty: set[int] = set()  # partitions the last fetch found empty
        self._answer_seconds = INITIAL_ANSWER_SECONDS
        self._fetching_stopped = False
        self._closed = False
        self._acks = Acks(self._settings, self._nc, self._retiring, lambda: self._closed)

    @property
    def lease_seconds(self) -> float:
        return self._settings.ack_wait

    @property
    def held(self) -> int:
        """Messages received from the server and not handed out yet (for tests and metrics)."""
        return len(self._held)

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        if self._closed:
            raise TransportClosedError(f"NATS consumer of {self._stream} is closed")
        wait = max(wait_seconds, 0.0)
        if self._transport.fetch_fault(self._queue):  # the streams changed under us: take nothing
            time.sleep(min(wait, 1.0))
            return []
        arrived = self._transport.run(
            self._fetch(max(batch_size, 1), wait), wait + self._settings.request_timeout
        )
        return self._hand_out(arrived)

    def _hand_out(self, arrived: list[tuple[float, Any]]) -> list[QueueMessage]:
        """The messages to hand out of those received: none whose lease ran out meanwhile."""
        now, out = time.monotonic(), []
        for received_at, msg in arrived:
            age = now - received_at
            if age >= self._settings.ack_wait:
                logger.debug("dropping %s: held past its lease", message_id(msg))
                continue  # its lease ran out while it waited here: the server redelivered it
            message = self._decode(msg)
            if age > REFRESH_AFTER_SECONDS:
                self.extend_lease(message)
            out.append(message)
        return out

    # -- pulling (on the connection's loop) ----------------------------------------------------

    async def _fetch(self, batch: int, wait: float) -> list[tuple[float, Any]]:
        if self._acks.pending:  # the partitions of acked messages free before they are probed
            await asyncio.wait(set(self._acks.pending), timeout=self._settings.request_timeout)
        if not self._held and not self._closed and not self._fetching_stopped:
            await self._pull(batch, wait)
        out: list[tuple[float, Any]] = []
        while self._held and len(out) < batch:
            out.append(self._held.popleft())
        return out

    async def _pull(self, demand: int, wait: float) -> None:
        """Ask the partitions for up to ``demand`` messages, waiting at most ``wait`` seconds."""
        deadline = asyncio.get_running_loop().time() + wait
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        pull = await self._current_inbox()
        try:
            await self._probe(pull, demand, deadline)
            left = deadline - asyncio.get_running_loop().time()
            if not self._held and left > 0:  # busy partitions' requests are still open, too
                body = json.dumps({"batch": 1, "expires": int(left * 1e9)}).encode()
                due = deadline + LOST_ANSWER_SECONDS
                for partition in sorted(pull.idle):
                    pull.expect(partition, due)
                    await self._request(pull, partition, body)
                await self._until(lambda: bool(self._held), deadline)
        finally:
            if self._closed:
                self._retire_inbox()
            elif pull.open:  # cancelled if no fetch comes soon (a saturated or stopped consumer)
                loop = asyncio.get_running_loop()
                self._idle_timer = loop.call_later(IDLE_SECONDS, self._retire_inbox)

    async def _current_inbox(self) -> Pull:
        """The consumer's inbox; a new one after a reconnect (the server may have lost the
        requests of the old one, whose partitions would then never be asked again)."""
        pull = self._inbox
        if pull is not None and pull.reconnects != self._nc.stats["reconnects"]:
            self._retire_inbox()
            pull = None
        if pull is None:
            pull = self._inbox = await self._open_inbox()
        return pull.reset()

    def _retire_inbox(self) -> None:
        """Cancel the requests still open: unsubscribe the inbox; the next fetch opens another."""
        self._idle_timer = None
        if self._inbox is not None:
            self._retire(self._inbox.sub)
            self._inbox = None

    async def _open_inbox(self) -> Pull:
        pull = Pull(self._nc.new_inbox(), self._hold, self._changed)
        pull.reconnects = self._nc.stats["reconnects"]
        pull.sub = await self._nc.subscribe(f"{pull.inbox}.*", cb=pull.on_reply)
        return pull

    async def _probe(self, pull: Pull, demand: int, deadline: float) -> None:
        """Probe the partitions in waves until ``demand`` messages came or all were asked.

        Partitions the previous fetch found empty are asked last (for this fetch only, so none
        is passed over for long): a wave then rarely goes to a partition with nothing in it.
        """
        partitions = len(self._next_subjects)
        loop = asyncio.get_running_loop()
        for partition in pull.forget_unanswered(loop.time()):
            logger.warning(
                "%s: no answer to the long poll of partition %s; asking it again",
                self._stream,
                partition,
            )
        order = [(self._cursor + i) % partitions for i in range(partitions)]
        order = [p for p in order if p not in pull.open]  # those reply here when they can
        order.sort(key=self._empty.__contains__)  # stable: the rotation order otherwise
        self._empty = pull.idle  # this fetch's answers decide the next one's order
        first = True
        while order and len(self._held) < demand and not self._closed:
            if not first and loop.time() >= deadline:
                return  # the first wave always goes out, even for a wait of 0
            first = False
            size = demand - len(self._held)  # a wave leases at most what is still missing
            wave, order = order[:size], order[size:]
            self._cursor = (wave[-1] + 1) % partitions
            for partition in wave:
                pull.probing[partition] = loop.time()
                await self._request(pull, partition, NO_WAIT_PROBE)
            before = len(self._held)
            done = functools.partial(self._probed, pull, wave, demand)
            await self._until(done, loop.time() + self._probe_grace())
            pull.probing.clear()  # a busy partition's late answer says nothing about latency
            self._learn(pull.latencies)
            if before and len(self._held) == before:
                return  # a wave found nothing more: the partitions left are likely empty too
            if self._held and pull.open:
                return  # busy partitions' probes are open: each more wave adds more of them

    def _probed(self, pull: Pull, wave: list[int], demand: int) -> bool:
        return pull.answered.issuperset(wave) or len(self._held) >= demand

    def _probe_grace(self) -> float:
        """How long an unanswered probe may take before its partition counts as busy."""
        return min(max(4 * self._answer_seconds, PROBE_GRACE_SECONDS), MAX_PROBE_GRACE_SECONDS)

    def _learn(self, latencies: list[float]) -> None:
        for latency in latencies:  # moving average of how fast the server answers a probe
            self._answer_seconds += (latency - self._answer_seconds) / 8
        latencies.clear()

    async def _request(self, pull: Pull, partition: int, body: bytes) -> None:
        reply = f"{pull.inbox}.{partition}"
        pull.open.add(partition)
        await self._nc.publish(self._next_subjects[partition], body, reply)

    async def _until(self, done: Callable[[], bool], deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while not done() and not self._closed and (left := deadline - loop.time()) > 0:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    def _retire(self, sub: Any) -> None:
        """Cancel a fetch's open requests: unsubscribe, and keep what arrived before that."""
        task = asyncio.ensure_future(self._drain(sub))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _drain(self, sub: Any) -> None:
        with contextlib.suppress(*CLIENT_ERRORS):
            await asyncio.wait_for(sub.drain(), self._settings.request_timeout)
            return
        # The connection is down or closing: nats-py has no public call left to forget the
        # subscription (drain marked it closed), so drop it from the client here.
        with contextlib.suppress(Exception):
            sub._stop_processing()
            self._nc._remove_sub(sub._id)

    def _hold(self, msg: Any) -> None:
        if logger.isEnabledFor(logging.DEBUG):  # the id is parsed from the reply subject
            logger.debug("received %s", message_id(msg))
        self._held.append((time.monotonic(), msg))
        if self._closed:
            self._release(lambda _: True)
        elif self._release_timer is None:
            loop = asyncio.get_running_loop()
            self._release_timer = loop.call_later(self._hold_limit, self._release_stale)

    def _release_stale(self) -> None:
        self._release_timer = None
        now = time.monotonic()
        self._release(lambda received_at: now - received_at >= self._hold_limit)
        if self._held:
            due = self._held[0][0] + self._hold_limit - now
            self._release_timer = asyncio.get_running_loop().call_later(due, self._release_stale)

    def _release(self, due: Callable[[float], bool]) -> None:
        """Give back held messages for which ``due(received_at)`` holds (oldest first)."""
        while self._held and due(self._held[0][0]):
            received_at, msg = self._held.popleft()
            if time.monotonic() - received_at < self._settings.ack_wait:  # else redelivered
                logger.info("giving back %s: no fetch asked for it", message_id(msg))
                task = asyncio.ensure_future(_nak(msg))
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)

    # -- messages ------------------------------------------------------------------------------

    def _decode(self, msg: Any) -> QueueMessage:
        return received_message(msg, self._stream, self._transport.stream_unit(self._queue))

    def ack(self, message: QueueMessage) -> None:
        """Send the ack; its confirmation is awaited by the next fetch and by ``close``.

        Raises:
            TransportError: the connection's loop is gone (the transport was reset).
        """
        try:
            self._loop.call_soon_threadsafe(self._acks.send, message.native)
        except RuntimeError as exc:
            raise TransportError(f"NATS connection of {self._stream} is closed") from exc

    def nack(self, message: QueueMessage) -> None:
        delay = self._settings.retry_backoff or None
        self._transport.run(message.native.nak(delay=delay))

    def nack_later(self, message: QueueMessage, delay_seconds: float) -> bool:
        """``nak`` with the delay: JetStream redelivers the message after it."""
        self._transport.run(message.native.nak(delay=delay_seconds))
        return True

    def dead_letter(self, message: QueueMessage) -> None:
        """Terminate redelivery of the message, and wait for the server to confirm it.

        Unconfirmed, the next fetch may probe the partition before the server processed the
        termination: the probe then waits as if the message were still in flight, and a
        termination (unlike an ack or a nak) does not serve waiting requests, so the partition
        would stall until the request is cancelled.
        """
        msg = message.native
        self._transport.run(self._nc.request(msg.reply, b"+TERM", self._settings.request_timeout))

    def extend_lease(self, message: QueueMessage) -> None:
        self._transport.run(message.native.in_progress())

    def stop_fetching(self) -> list[QueueMessage]:
        """Cancel the requests still open; returns what they brought before they were cancelled.

        Those messages count as delivered here already: run in the drain, they cost no second
        delivery, as a ``nak`` at :meth:`close` would.
        """
        self._fetching_stopped = True
        with contextlib.suppress(TransportError):
            return self._hand_out(
                self._transport.run(self._collect(), self._settings.request_timeout + 5)
            )
        return []

    async def _collect(self) -> list[tuple[float, Any]]:
        await self._stop_pulling()
        if self._retiring:  # the inbox drained: whatever crossed the unsubscribe is here now
            await asyncio.wait(set(self._retiring), timeout=self._settings.request_timeout)
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None
        held, self._held = list(self._held), deque()
        return held

    async def _stop_pulling(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._retire_inbox()

    def close(self) -> None:
        """Stop pulling, then give back what was received and not handed out."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(TransportError):
            self._transport.run(self._shutdown(), self._settings.request_timeout + 5)

    async def _shutdown(self) -> None:
        self._changed.set()  # a fetch still waiting (closed from another thread) ends now
        if self._release_timer is not None:
            self._release_timer.cancel()
        await self._stop_pulling()
        if self._acks.pending:
            await asyncio.wait(set(self._acks.pending), timeout=self._settings.request_timeout)
        if self._retiring:  # pull inboxes drained: nothing more can arrive
            await asyncio.wait(set(self._retiring), timeout=self._settings.request_timeout)
        self._release(lambda _: True)
        if self._retiring:
            await asyncio.wait(set(self._retiring), timeout=self._settings.request_timeout)
        with contextlib.suppress(*CLIENT_ERRORS):  # the naks reach the server before we return
            await self._nc.flush(self._settings.request_timeout)


async def _nak(msg: Any) -> None:
    with contextlib.suppress(*CLIENT_ERRORS):
        await msg.nak()


async def _new_event() -> asyncio.Event:
    return asyncio.Event()  # created on the loop that will use it
