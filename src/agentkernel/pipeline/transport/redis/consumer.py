"""The Redis Streams consumer: claims expired tokens, reads new ones, resolves session heads.

See :mod:`agentkernel.pipeline.transport.redis` for the design. Every settling call (``ack``,
``nack``, ``nack_later``, ``dead_letter``, ``extend_lease``) is one script that first checks
that this consumer still holds the delivery the handle names, so a stale handle does nothing.

A nack Redis could not be reached for (a restart, say) still raises, and is kept: the consumer's
next fetch sends it again, so the message comes back as soon as Redis does, not one lease later.
Sending it late is safe for the same reason (a delivery settled or claimed since is left alone).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import redis

from agentkernel.core.config.queues import RedisQueueConfig
from agentkernel.core.errors import TransportClosedError, TransportError
from agentkernel.core.redis_client import node_for
from agentkernel.pipeline.transport.blocking import BlockingConsumer
from agentkernel.pipeline.transport.redis.acks import PipelinedAcks
from agentkernel.pipeline.transport.redis.codec import Handle, decoded
from agentkernel.pipeline.transport.redis.errors import stream_errors
from agentkernel.pipeline.wire.envelope import QueueMessage

if TYPE_CHECKING:
    from agentkernel.pipeline.transport.redis.keys import QueueKeys

logger = logging.getLogger(__name__)

#: The group member a closing consumer hands its leased tokens to, claimable at once.
PARKING_CONSUMER = "ak-parked"


class RedisSource(Protocol):
    """What a consumer uses of its transport (:class:`~.transport.RedisStreamsTransport`)."""

    settings: RedisQueueConfig
    client: redis.Redis
    #: The scripts of :mod:`.scripts` by name, called as ``script(keys, args)``.
    scripts: dict[str, Callable[..., Any]]


class RedisStreamsConsumer(BlockingConsumer):
    """One member of a queue's consumer group; its name is unique per instance."""

    def __init__(self, transport: RedisSource, keys: QueueKeys) -> None:
        self._settings = transport.settings
        self._keys = keys
        self._client = transport.client
        self._scripts = transport.scripts
        self._group = self._settings.group
        self._lease_ms = max(int(self._settings.ack_wait * 1000), 1)
        self.name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._cursor = b"0-0"
        self._closed = threading.Event()
        self._acks = PipelinedAcks(lambda: node_for(self._client, keys.ready), self._scripts["ACK"])
        #: Nacks Redis could not be reached for: (message, idle ms, what, give up at monotonic).
        self._unsent_nacks: list[tuple[QueueMessage, int, str, float]] = []
        self._nacks_lock = threading.Lock()
        with stream_errors(f"join of {keys.ready}"):
            self._client.xgroup_createconsumer(keys.ready, self._group, self.name)

    @property
    def lease_seconds(self) -> float:
        return self._settings.ack_wait

    # -- fetching -------------------------------------------------------------------------------

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        deadline = time.monotonic() + max(wait_seconds, 0.0)
        while True:
            self._check_open()
            if batch_size < 1:
                return []
            self._acks.settle()  # the acks sent so far have run: their sessions are handed on
            self._resend_nacks()
            got = self._claim_and_read(batch_size)
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            got = self._blocking_read(batch_size, min(left, self._settings.block_slice))
            if got:
                return got

    def _claim_and_read(self, count: int) -> list[QueueMessage]:
        args = [self._group, self.name, count, self._lease_ms, self._cursor, self._keys.tag]
        with stream_errors(f"fetch from {self._keys.name}"):
            cursor, incarnation, resolved = self._scripts["FETCH"]([*self._ready_meta], args)
        self._cursor = cursor
        return self._messages(incarnation, resolved)

    def _blocking_read(self, count: int, seconds: float) -> list[QueueMessage]:
        """Wait up to ``seconds`` for new tokens (the slice keeps stop and expiries in view)."""
        block_ms = max(int(seconds * 1000), 1)  # BLOCK 0 would wait forever
        with stream_errors(f"blocking read from {self._keys.name}"):
            got: Any = self._client.xreadgroup(
                self._group, self.name, {self._keys.ready: ">"}, count=count, block=block_ms
            )
            if not got:
                return []
            triples = [x for token, fields in got[0][1] for x in _named(token, fields)]
            incarnation, resolved = self._scripts["RESOLVE"](
                [*self._ready_meta], [self._group, self._keys.tag, *triples]
            )
        messages = self._messages(incarnation, resolved)
        if self._closed.is_set():  # closed while this read was blocked: hand them back
            self._leave()
            return []
        return messages

    @property
    def _ready_meta(self) -> tuple[str, str]:
        return self._keys.ready, self._keys.meta

    def _messages(self, incarnation: bytes, resolved: list[Any]) -> list[QueueMessage]:
        unit = f"redis:{self._keys.name}@{incarnation.decode('ascii', 'replace')}"
        messages = []
        for item in resolved:
            token, session, count = item[0], item[1], int(item[2])
            if not count:
                logger.warning(
                    "dropped token %s on %s: session %r has no message",
                    token.decode("ascii", "replace"),
                    self._keys.name,
                    session,
                )
                continue
            handle = Handle(token, count, item[3], session, self.name)
            fields = dict(zip(item[4][0::2], item[4][1::2], strict=True))
            messages.append(decoded(self._keys.name, unit, handle, fields))
        return messages

    # -- settling -------------------------------------------------------------------------------

    def ack(self, message: QueueMessage) -> None:
        """Send the ack without waiting for Redis's answer (see :mod:`.acks`)."""
        handle = self._handle(message)
        keys = [self._keys.ready, self._keys.session(handle.session)]
        args = [*self._owner(handle), handle.head, handle.session]
        self._acks.send(keys, args, f"ack of {message.message_id} on {self._keys.name}")

    def dead_letter(self, message: QueueMessage) -> None:
        handle = self._handle(message)
        keys = [self._keys.ready, self._keys.session(handle.session), self._keys.dlq]
        reason = message.undecodable or "exceeded max_receive_count"
        args = [handle.head, handle.session, reason, self._settings.dlq_max_length]
        with stream_errors(f"dead-lettering of {message.message_id}"):
            self._scripts["DEAD_LETTER"](keys, [*self._owner(handle), *args])

    def nack(self, message: QueueMessage) -> None:
        self._nack(message, self._lease_ms, "nack")

    def nack_later(self, message: QueueMessage, delay_seconds: float) -> bool:
        delay_ms = int(delay_seconds * 1000)
        if delay_ms > self._lease_ms:
            return False  # Redis takes no delivery time in the future: the caller holds it
        self._nack(message, self._lease_ms - delay_ms, "delayed nack")
        return True

    def _nack(self, message: QueueMessage, idle_ms: int, what: str) -> None:
        """A nack; kept for the next fetch when Redis cannot be reached (then raised)."""
        try:
            self._set_idle(message, idle_ms, what)
        except TransportError as exc:
            if isinstance(exc.__cause__, (redis.ConnectionError, redis.TimeoutError)):
                expires = time.monotonic() + self._settings.ack_wait  # then claimable anyway
                with self._nacks_lock:
                    self._unsent_nacks.append((message, idle_ms, what, expires))
            raise

    def _resend_nacks(self) -> None:
        with self._nacks_lock:
            due, self._unsent_nacks = self._unsent_nacks, []
        for i, (message, idle_ms, what, expires) in enumerate(due):
            if time.monotonic() >= expires:
                continue
            try:
                self._set_idle(message, idle_ms, what)
            except TransportError:  # Redis still away: the rest waits for the next fetch
                with self._nacks_lock:
                    self._unsent_nacks[:0] = due[i:]
                return
            logger.info("%s of %s sent again: Redis is back", what, message.message_id)

    def extend_lease(self, message: QueueMessage) -> None:
        self._set_idle(message, 0, "lease extension")

    def _set_idle(self, message: QueueMessage, idle_ms: int, what: str) -> None:
        handle = self._handle(message)
        with stream_errors(f"{what} of {message.message_id}"):
            self._scripts["SET_IDLE"]([self._keys.ready], [*self._owner(handle), idle_ms])

    def _owner(self, handle: Handle) -> list[Any]:
        """Who must still hold the delivery: the member it went to, whichever consumer of the
        queue settles it."""
        return [self._group, handle.consumer, handle.token, handle.count]

    @staticmethod
    def _handle(message: QueueMessage) -> Handle:
        if not isinstance(message.native, Handle):
            raise TypeError(f"message {message.message_id} was not received from Redis Streams")
        return message.native

    # -- lifecycle ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise TransportClosedError(f"consumer {self.name} of {self._keys.name} is closed")

    def _leave(self) -> None:
        args = [self._group, self.name, PARKING_CONSUMER, self._lease_ms]
        with stream_errors(f"leaving {self._keys.ready}"):
            handed = self._scripts["LEAVE"]([self._keys.ready], args)
        if handed:
            logger.info("handed %s unsettled messages of %s back", handed, self._keys.name)

    def close(self) -> None:
        """Hand back what this consumer still holds (each counts one more delivery when
        claimed again) and leave the group."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._acks.close()
            self._leave()
        except Exception:  # the leases run out instead
            logger.warning("consumer %s could not leave %s", self.name, self._keys.name)


def _named(token: bytes, fields: dict[bytes, bytes]) -> tuple[bytes, str, bytes]:
    """A token as RESOLVE takes it: its id, whether it names a session at all, the session."""
    session = fields.get(b"s")
    return token, "0" if session is None else "1", session or b""
