"""Building the redis-py client for a URL: one server, or a Redis Cluster.

A URL whose scheme is ``redis+cluster://`` (``rediss+cluster://`` with TLS) names one node of a
Redis Cluster; the client (``redis.cluster.RedisCluster``) discovers the others and sends each
command to the node serving its key's slot. Any other URL is one server (``redis.Redis``).
Both are typed as ``redis.Redis``: the backends call the same command methods on either, and
the few things a cluster does differently (a pipeline of commands without keys, a connection of
one's own) go through :func:`node_for`.

redis-py is imported when a client is built, so this module imports without the extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import redis

#: The URL schemes of a Redis Cluster, and the scheme redis-py takes for each.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


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
