"""Building the redis-py client for a URL: one server, or a Redis Cluster.

A URL whose scheme is ``redis+cluster://`` (``rediss+cluster://`` with TLS) names one node of a
Redis Cluster; the client (``redis.cluster.RedisCluster``) discovers the others and sends each
command to the node serving its key's slot. Any other URL is one server (``redis.Redis``).
Both are typed as ``redis.Redis``: the backends call the same command methods on either, and
the few things a cluster does differently (a pipeline of commands without keys, a connection of
one's own) go through :func:`node_for` and :func:`on_node`.

redis-py is imported when a client is built, so this module imports without the extra.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    import redis

T = TypeVar("T")

#: The URL schemes of a Redis Cluster, and the scheme redis-py takes for each.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def redis_client(url: str, **options: Any) -> redis.Redis:
    """A redis-py client for ``url``; ``options`` are keyword arguments of ``from_url``.

    A single-server client connects on first use; a cluster client asks the node the URL
    names for the cluster's slots at once, so at least that node must answer.

    Raises:
        ValueError: the URL is malformed (the message names the scheme, never the password).
        TypeError: an option is unknown to redis-py.
        redis.RedisError: no node of the cluster answered (cluster URLs only).
    """
    import redis

    scheme, _, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    if plain is None:
        return redis.Redis.from_url(url, **options)
    from redis.cluster import RedisCluster

    # The cluster client serves the same command methods: typed as one, used as one.
    return cast("redis.Redis", RedisCluster.from_url(f"{plain}://{rest}", **options))


def is_cluster(client: redis.Redis) -> bool:
    """Whether ``client`` is a Redis Cluster client."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def node_for(client: redis.Redis, key: str | bytes) -> redis.Redis:
    """The single-server client of the node that serves ``key`` (``client`` itself when it is
    not a cluster client): for server-wide commands (``INFO``) about that node, pipelines
    mixing them with keyed ones, and connections held outside the client's routing.

    A resharding or failover moves the slot; a caller holding the node then gets ``MOVED``
    errors and must ask again.
    """
    if not is_cluster(client):
        return client
    cluster: Any = client
    node = cluster.get_node_from_key(key)
    return cast("redis.Redis", cluster.get_redis_connection(node))


def on_node(client: redis.Redis, key: str | bytes, call: Callable[[redis.Redis], T]) -> T:
    """``call(node)`` with the client of the node serving ``key`` (see :func:`node_for`); on a
    cluster whose slot moved since the client last looked (``MOVED``, ``ASK``: a resharding,
    a failover), once more after the client has read the cluster's slots again.
    """
    from redis.exceptions import AskError  # MovedError is a subclass

    try:
        return call(node_for(client, key))
    except AskError:
        if not is_cluster(client):
            raise
        cluster: Any = client
        cluster.nodes_manager.initialize()
        return call(node_for(client, key))


def hash_tag(prefix: str) -> str | None:
    """The hash tag every key starting with ``prefix`` carries (``ak`` of ``{ak}:``), or
    ``None`` when the prefix has none (Redis hashes the first non-empty ``{...}`` of a key)."""
    start = prefix.find("{")
    end = prefix.find("}", start + 1) if start >= 0 else -1
    return prefix[start + 1 : end] if end > start + 1 else None


def require_one_slot(client: redis.Redis, key: str, prefix: str, *others: str) -> None:
    """On a cluster, refuse a store whose keys would not all share one hash slot: its scripts
    and pipelines touch several keys at once, which a cluster runs only within one slot.

    Args:
        key: the store's configuration key, for the message (``session.redis``).
        prefix: the store's key prefix; it must carry a hash tag (``{ak}:``).
        others: further prefixes the store reads (an upstream prefix); same slot as ``prefix``.

    Raises:
        AKConfigError: on a cluster, a prefix without a hash tag or in another slot.
    """
    if not is_cluster(client):
        return
    from agentkernel.core.errors import AKConfigError

    tag = hash_tag(prefix)
    if tag is None:
        raise AKConfigError(
            f"{key}.prefix: on a Redis Cluster the prefix must carry a hash tag, e.g. "
            f"'{{{prefix.rstrip(':') or 'ak'}}}:', so that every key of the store shares one slot"
        )
    cluster: Any = client
    for other in others:
        found = hash_tag(other)
        if found is None or cluster.keyslot(found) != cluster.keyslot(tag):
            raise AKConfigError(
                f"{key}: on a Redis Cluster, {other!r} must carry a hash tag of the same slot as "
                f"the prefix's {{{tag}}}"
            )
