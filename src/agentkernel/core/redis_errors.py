"""The one classification of redis-py exceptions, for every backend that talks to Redis.

A lost or refused connection, a timeout, or a Redis Cluster slot without a primary
(``CLUSTERDOWN``, ``TRYAGAIN``) means Redis cannot serve the call right now: worth retrying, and
so does a Redis that refuses writes because it is full (``OOM``: ``maxmemory`` with
``noeviction``; the stores raise :class:`~agentkernel.core.errors.StoreFullError` for it). Any
other redis-py error (the cluster client's own ``RedisClusterException`` included) is a failure
of the call itself. Each backend says which of
its own error classes those two outcomes become (a response store raises
:class:`~agentkernel.core.errors.StoreUnavailableError` / ``ResponseStoreError``, a session store
``SessionStoreUnavailableError`` / ``SessionStoreError``, the Kafka bookkeeping
``TransportError`` for both)::

    _errors = functools.partial(
        redis_errors, unavailable=StoreUnavailableError, failed=ResponseStoreError
    )

    with _errors(f"read of {request_id}"):
        ...

redis-py is imported when a mapping first runs, so this module imports without the extra.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from agentkernel.core.errors import AgentKernelError, AKConfigError
from agentkernel.core.redis_client import redis_client

if TYPE_CHECKING:
    import redis

#: Seconds to connect and to wait for an answer: an unreachable Redis fails a call fast.
SOCKET_TIMEOUT_SECONDS = 5.0


def connect(url: str, key: str) -> redis.Redis:
    """A redis-py client for ``url`` (:func:`~agentkernel.core.redis_client.redis_client`:
    ``redis+cluster://`` names a Redis Cluster); a single server is connected on first use.

    Raises:
        AKConfigError: the URL is malformed, or no node of a cluster answered; the message
            names the config ``key``.
    """
    import redis

    timeout = SOCKET_TIMEOUT_SECONDS
    try:
        return redis_client(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    except ValueError as exc:  # the message names the scheme, never the password
        raise AKConfigError(f"{key}: {exc}") from exc
    except redis.RedisError as exc:  # a cluster client found no node to ask for the slots
        raise AKConfigError(f"{key}: no node of the Redis Cluster answered: {exc}") from exc


@contextmanager
def redis_errors(
    operation: str,
    *,
    unavailable: type[AgentKernelError],
    failed: type[AgentKernelError],
    unreadable: bool = False,
    full: type[AgentKernelError] | None = None,
) -> Iterator[None]:
    """Turn redis-py exceptions raised in the block into ``unavailable`` or ``failed``.

    Args:
        operation: what the block does, for the message ("read of r1").
        unavailable: raised when Redis cannot be reached or did not answer in time.
        failed: raised for any other redis-py error.
        full: raised when Redis refuses a write because it is full; default ``unavailable``.
        unreadable: also turn a record that does not decode (``ValueError``, ``KeyError``,
            ``TypeError``) into ``failed``.
    """
    import redis
    from redis.exceptions import RedisClusterException

    outage: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)
    try:
        yield
    except outage + _cluster_unavailable() as exc:
        raise unavailable(f"Redis {operation} failed: {exc}") from exc
    except redis.exceptions.OutOfMemoryError as exc:
        raise (full or unavailable)(
            f"Redis {operation} refused: the server is full (maxmemory reached) and evicts "
            f"nothing; make room or raise maxmemory: {exc}"
        ) from exc
    except (redis.RedisError, RedisClusterException) as exc:
        raise failed(f"Redis {operation} failed: {exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        if not unreadable:
            raise
        raise failed(f"Redis {operation}: unreadable record: {exc!r}") from exc


def _cluster_unavailable() -> tuple[type[Exception], ...]:
    """A Redis Cluster's ways of saying a slot has no primary right now (a failover under way,
    a node gone): an outage, worth retrying, like a refused connection."""
    from redis import exceptions

    return (exceptions.ClusterDownError, exceptions.TryAgainError, exceptions.SlotNotCoveredError)
