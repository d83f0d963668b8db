"""Acknowledgements sent without waiting for Redis's answer, on a connection of their own.

Redis runs a command as soon as it arrives, so an ack takes effect (and hands its session on)
without the sender waiting for the reply. ``send`` writes the ack's script call and returns;
the replies are read later: those already in when the next ack goes out, and all of them before
the consumer's next fetch (:meth:`settle`), so a fetch never starts before the acks its thread
sent have run. Acks of one batch then share a round trip, as in the NATS transport. A failed
reply is logged and its message comes again after its lease, like an ack lost on the wire.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

import redis

from agentkernel.pipeline.transport.redis.errors import stream_errors

logger = logging.getLogger(__name__)


class PipelinedAcks:
    """The acks of one consumer; thread-safe.

    Args:
        client: the transport's redis-py client (its pool lends the connection).
        script: the ACK script (its ``sha``; called directly to load it again after a
            ``NOSCRIPT``, e.g. from a restarted Redis).
    """

    def __init__(self, client: redis.Redis, script: Any) -> None:
        self._pool = client.connection_pool
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
                self._conn.send_command(
                    "EVALSHA", self._script.sha, len(keys), *keys, *args, check_health=False
                )
            self._sent.append((keys, args, what))

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
            keys, args, what = self._sent.popleft()
            try:
                self._conn.read_response()
            except redis.exceptions.NoScriptError:
                self._again(keys, args, what)
            except redis.ResponseError as exc:
                logger.warning("%s failed: %s; it comes again after its lease", what, exc)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._lost(what, exc)

    def _readable(self) -> bool:
        try:
            return bool(self._conn.can_read(timeout=0))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._lost("reading ack replies", exc)
            return False

    def _again(self, keys: list[Any], args: list[Any], what: str) -> None:
        """Send an ack that found its script gone once more, waiting for it (loads it)."""
        try:
            with stream_errors(what):
                self._script(keys, args)
        except Exception as exc:  # the message comes again after its lease
            logger.warning("%s failed: %s", what, exc)

    def _lost(self, what: str, exc: Exception) -> None:
        """The connection broke: the acks still unanswered may not have run."""
        logger.warning(
            "%s: connection lost (%s); %s unconfirmed acks come again after their lease",
            what,
            exc,
            len(self._sent) + 1,
        )
        self._sent.clear()
        if self._conn is not None:
            self._conn.disconnect()
