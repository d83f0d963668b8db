"""The Redis Streams transport: the client, provisioning and sending.

See :mod:`agentkernel.pipeline.transport.redis` for the design; the consumer is in
:mod:`.consumer`, the scripts in :mod:`.scripts`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from agentkernel.core.config.queues import QueuesConfig, RedisQueueConfig
from agentkernel.core.errors import AKConfigError, MessageRejectedError, TransportError
from agentkernel.core.redis_client import node_for, redis_client
from agentkernel.pipeline.transport.base import require_block
from agentkernel.pipeline.transport.blocking import BlockingTransport
from agentkernel.pipeline.transport.redis import scripts
from agentkernel.pipeline.transport.redis.codec import encode_attributes
from agentkernel.pipeline.transport.redis.consumer import RedisStreamsConsumer
from agentkernel.pipeline.transport.redis.errors import stream_errors
from agentkernel.pipeline.transport.redis.keys import QueueKeys
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

logger = logging.getLogger(__name__)

_KEY = "execution.queues.redis"
#: Consumers that hold nothing and were not seen for this long (and ten leases) are removed.
PRUNE_IDLE_SECONDS = 600.0
#: The oldest Redis the scripts run on (XAUTOCLAIM and XGROUP CREATECONSUMER came in 6.2).
MIN_VERSION = (6, 2)


class RedisStreamsTransport(BlockingTransport):
    """INPUT and OUTPUT as two sets of streams on one Redis, one consumer group per queue.

    Args:
        settings: the ``execution.queues.redis`` block.

    Raises:
        AKConfigError: a malformed URL or client setting, or (without ``auto_provision``) a
            queue whose ready stream or consumer group does not exist.
        TransportError: Redis is unreachable.
    """

    def __init__(self, settings: RedisQueueConfig) -> None:
        if settings.socket_timeout <= settings.block_slice:
            raise AKConfigError(f"{_KEY}.socket_timeout: must exceed block_slice")
        self.settings = settings
        self.queues = {q: QueueKeys.of(settings.prefix, q.value) for q in QueueName}
        self._instance = uuid.uuid4().hex  # with the time: the incarnation id of a new queue
        self.client = _client(settings)
        #: The scripts of :mod:`.scripts` by name, called as ``script(keys, args)``.
        self.scripts: dict[str, Callable[..., Any]] = {
            name: self.client.register_script(getattr(scripts, name))
            for name in ("SEND", "FETCH", "RESOLVE", "ACK", "DEAD_LETTER", "SET_IDLE", "LEAVE")
        }
        self._prune: Callable[..., Any] = self.client.register_script(scripts.PRUNE)
        self._check_servers()
        for keys in self.queues.values():
            self._provision(keys)

    @classmethod
    def from_config(cls, block: QueuesConfig) -> RedisStreamsTransport:
        return cls(require_block(block, "redis"))

    def _check_servers(self) -> None:
        """Refuse a server older than Redis 6.2, which lacks commands the scripts use, and
        one that may evict keys: a lost token or session stream loses messages without a
        trace (``allow_eviction`` turns that refusal into a warning). On a cluster: each node
        serving a queue."""
        with stream_errors("check of the server's version and eviction policy"):
            infos = [node_for(self.client, keys.ready).info() for keys in self.queues.values()]
        for info in infos:
            require_version(str(info.get("redis_version", "")))
        policies = {str(info.get("maxmemory_policy", "noeviction")) for info in infos}
        policy = ", ".join(sorted(policies - {"noeviction"}))
        if not policy:
            return
        text = f"the Redis maxmemory-policy is {policy}: it may evict queued messages"
        if not self.settings.allow_eviction:
            raise AKConfigError(
                f"{_KEY}: {text}; set maxmemory-policy noeviction on the server, or "
                "allow_eviction: true to accept the risk"
            )
        logger.warning("%s: %s", _KEY, text)

    def _provision(self, keys: QueueKeys) -> None:
        group = self.settings.group
        with stream_errors(f"check of {keys.ready}"):
            try:
                groups = self.client.xinfo_groups(keys.ready)
            except redis.ResponseError:  # no such key
                groups = []
            if any(g["name"] == group.encode() for g in groups):
                return
            if not self.settings.auto_provision:
                raise AKConfigError(
                    f"{_KEY}: consumer group '{group}' of stream {keys.ready} does not exist; "
                    f"create it (redis-cli XGROUP CREATE '{keys.ready}' {group} 0 MKSTREAM) "
                    "or set auto_provision: true for development"
                )
            try:
                self.client.xgroup_create(keys.ready, group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):  # another process created it meanwhile
                    raise
        logger.info("created consumer group %s of %s", group, keys.ready)

    # -- sending --------------------------------------------------------------------------------

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        keys = self.queues[QueueName(queue)]
        body, session, dedup = self._encoded(message)
        args = [
            session,
            body,
            encode_attributes(message.attributes),
            dedup,
            max(int(self.settings.dedup_window * 1000), 1),
            f"{self._instance}-{time.time_ns()}",
            "1" if message.group_id is None else "0",
        ]
        send_keys = [keys.ready, keys.meta, keys.session(session), keys.dedup(dedup)]
        with stream_errors(f"send to {keys.name}"):
            number = self.scripts["SEND"](send_keys, args)
        return None if number is None else f"{keys.name}:{int(number)}"

    def _encoded(self, message: QueueMessage) -> tuple[bytes, bytes, bytes]:
        """The body, session id (a one-off for a message without group) and dedup id as bytes.

        Raises:
            MessageRejectedError: one of them is not UTF-8 text, or the body is too large.
        """
        group = uuid.uuid4().hex if message.group_id is None else message.group_id
        try:
            body, session = message.body.encode(), group.encode()
            dedup = (message.dedup_id or "").encode()
        except UnicodeEncodeError as exc:
            raise MessageRejectedError(f"message is not encodable as UTF-8: {exc}") from exc
        if len(body) > self.settings.max_message_bytes:
            raise MessageRejectedError(
                f"message is {len(body)} bytes; {_KEY}.max_message_bytes is "
                f"{self.settings.max_message_bytes}"
            )
        return body, session, dedup

    # -- the rest of QueueTransport ------------------------------------------------------------

    def create_consumer(self, queue: QueueName) -> RedisStreamsConsumer:
        keys = self.queues[QueueName(queue)]
        idle = max(PRUNE_IDLE_SECONDS, 10 * self.settings.ack_wait)
        with stream_errors(f"removal of departed consumers of {keys.ready}"):
            gone = self._prune([keys.ready], [self.settings.group, int(idle * 1000)])
        if gone:
            logger.info("removed %s departed consumers of %s", gone, keys.ready)
        return RedisStreamsConsumer(self, keys)

    def consumer_names(self, queue: QueueName) -> list[str]:
        """The names of ``queue``'s group members (the parking consumer included)."""
        keys = self.queues[QueueName(queue)]
        with stream_errors(f"consumers of {keys.ready}"):
            found = self.client.xinfo_consumers(keys.ready, self.settings.group)
        return [c["name"].decode() for c in found]

    def ping(self) -> None:
        with stream_errors("ping"):
            self.client.ping()

    def close(self) -> None:
        self.client.close()


def require_version(version: str) -> None:
    """Refuse a server reporting ``redis_version`` below 6.2 (Valkey reports 7.2.4).

    Raises:
        AKConfigError: the version is older, naming what is missing and what is needed.
    """
    numbers = [int(part) for part in version.split(".")[:2] if part.isdigit()]
    if len(numbers) == 2 and tuple(numbers) < MIN_VERSION:
        raise AKConfigError(
            f"{_KEY}: the server is Redis {version}; the redis transport needs Redis "
            "6.2 or later (XAUTOCLAIM, XGROUP CREATECONSUMER), or Valkey"
        )


def _client(settings: RedisQueueConfig) -> redis.Redis:
    options: dict[str, Any] = {
        "socket_timeout": settings.socket_timeout,
        "socket_connect_timeout": settings.socket_timeout,
        **settings.client_config,
        "protocol": 2,  # the replies of scripts and stream reads are read in RESP2 shapes
    }
    try:
        return redis_client(settings.url, **options)
    except (ValueError, TypeError) as exc:  # the message names the scheme, never the password
        raise AKConfigError(f"{_KEY}: {exc}") from exc
    except redis.RedisError as exc:  # a cluster client found no node to ask for the slots
        raise TransportError(f"{_KEY}: no node of the Redis Cluster answered: {exc}") from exc
