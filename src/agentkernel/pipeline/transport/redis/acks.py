"""Acknowledgements sent without waiting for Redis's answer, on a connection of their own.

Redis runs a command as soon as it arrives, so an ack takes effect (and hands its session on)
without the sender waiting for the reply. ``send`` writes the ack's script call and returns;
the replies are read later: those already in when the next ack goes out, and all of them before
the consumer's next fetch (:meth:`settle`), so a fetch never starts before the acks its thread
sent have run. Acks of one batch then share a round trip, as in the NATS transport.

A connection that breaks with acks unanswered (Redis restarted, say: the first ack after it
goes out on the closed connection) may have lost them, so they are sent again on a fresh one and
waited for. That is safe: an ack names the delivery it settles, and does nothing once it has run.
Only an ack that fails again is logged and left to come back after its lease. On a Redis Cluster
the connection is one to the node serving the queue's slot; an ack refused there because the
slot moved is sent again through the cluster client, which follows it, and the acks after it go
to the slot's new node.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import redis

from agentkernel.pipeline.transport.redis.errors import stream_errors

logger = logging.getLogger(__name__)

#: Replies that mean the ack did not run here and may run through the client: the script is not
#: loaded (a restarted Redis), or the cluster's slot is elsewhere or busy (resharding, failover;
#: the client follows the cluster, this connection does not).
_SEND_AGAIN = (
    redis.exceptions.NoScriptError,
    redis.exceptions.AskError,  # and MovedError, a subclass
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
)


class PipelinedAcks:
    """The acks of one consumer; thread-safe.

    Args:
        node: returns the single-server client of the queue's node, whose pool lends the
            connection (on a cluster, the node serving the queue's slot; asked again when an
            ack was refused there because the slot moved).
        script: the ACK script (its ``sha``; called directly to load it again after a
            ``NOSCRIPT``, e.g. from a restarted Redis).
    """

    def __init__(self, node: Callable[[], redis.Redis], script: Any) -> None:
        self._node = node
        self._pool = node().connection_pool
        self._moved = False  # a reply said the slot moved: take the new node's pool when idle
        self._script = script
        self._conn: Any = None
        self._sent: deque[tuple[list[Any], list[Any], str]] = deque()
        self._lock = threading.Lock()

    def send(self, keys: list[Any], args: list[Any], what: str) -> None:
        """Send one ack (``what`` names it in logs).

        Raises:
            TransportError: Redis cannot be reached; the ack was not sent.
        """
        with self._lock:
            self._read(wait=False)
            with stream_errors(what):
                if self._conn is None:
                    self._conn = self._pool.get_connection()
                try:
                    self._write(keys, args)
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    self._lost(what, exc)
                    self._write(keys, args)  # once more, on a new connection
            self._sent.append((keys, args, what))

    def _write(self, keys: list[Any], args: list[Any]) -> None:
        self._conn.send_command(
            "EVALSHA", self._script.sha, len(keys), *keys, *args, check_health=False
        )

    def settle(self) -> None:
        """Read every reply still due (their acks have run once this returns)."""
        with self._lock:
            self._read(wait=True)

    def close(self) -> None:
        """Settle, then give the connection back."""
        with self._lock:
            self._read(wait=True)
            conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.release(conn)

    def _read(self, wait: bool) -> None:
        while self._sent and (wait or self._readable()):
            keys, args, what = self._sent[0]
            try:
                self._conn.read_response()
            except _SEND_AGAIN as exc:
                self._sent.popleft()
                self._again(keys, args, what)
                self._moved |= isinstance(exc, redis.exceptions.AskError)
            except redis.ResponseError as exc:
                self._sent.popleft()
                logger.warning("%s failed: %s; it comes again after its lease", what, exc)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._lost(what, exc)
            else:
                self._sent.popleft()
        if self._moved and not self._sent:  # every reply from the old node is read
            self._repoint()

    def _repoint(self) -> None:
        """Leave the node the slot moved from: the next ack connects to its new node."""
        conn, self._conn, self._moved = self._conn, None, False
        if conn is not None:
            self._pool.release(conn)
        self._pool = self._node().connection_pool

    def _readable(self) -> bool:
        try:
            return bool(self._conn.can_read(timeout=0))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._lost("reading ack replies", exc)
            return False

    def _again(self, keys: list[Any], args: list[Any], what: str) -> None:
        """Send an ack once more through the client's pool, waiting for it (loads the script
        when it is gone)."""
        try:
            with stream_errors(what):
                self._script(keys, args)
        except Exception as exc:  # the message comes again after its lease
            logger.warning("%s failed: %s; it comes again after its lease", what, exc)

    def _lost(self, what: str, exc: Exception) -> None:
        """The connection broke: the acks still unanswered may not have run; send them again."""
        unconfirmed = list(self._sent)
        self._sent.clear()
        if self._conn is not None:
            self._conn.disconnect()  # the next send connects again
        logger.info(
            "%s: connection lost (%s); sending %s unconfirmed acks again",
            what,
            exc,
            len(unconfirmed),
        )
        for keys, args, name in unconfirmed:
            self._again(keys, args, name)
