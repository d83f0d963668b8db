"""Response stores: the ABC, the factory, and one backend per module."""

from __future__ import annotations

from agentkernel.core.config.stores import ResponseStoreConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.core.extras import require_extra, resolve_dotted
from agentkernel.pipeline.response_store.base import ResponseStore
from agentkernel.pipeline.wire.records import ResponseRecord, TurnTicket

__all__ = ["ResponseRecord", "ResponseStore", "TurnTicket", "create_response_store"]


def create_response_store(config: ResponseStoreConfig) -> ResponseStore:
    """Build the store named by ``execution.response_store.type``.

    Raises:
        AKConfigError: unknown type, missing backend block, or a bad dotted path.
        ImportError: the backend's extra is not installed (names the extra).
    """
    kind = config.type
    if kind == "in_memory":
        from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore

        return InMemoryResponseStore(ttl=config.ttl)
    if kind == "redis":
        if config.redis is None:
            raise AKConfigError(_missing("redis"))
        with require_extra("redis", "execution.response_store.type: redis"):
            from agentkernel.pipeline.response_store.redis import RedisResponseStore
        redis = config.redis
        return RedisResponseStore(
            redis.url,
            redis.prefix,
            config.ttl,
            allow_eviction=redis.allow_eviction,
            upstream_prefix=redis.upstream_prefix,
        )
    if kind == "dynamodb":
        if config.dynamodb is None or not config.dynamodb.table_name:
            raise AKConfigError(
                "execution.response_store.dynamodb.table_name: required when "
                "execution.response_store.type is 'dynamodb'"
            )
        with require_extra("dynamodb", "execution.response_store.type: dynamodb"):
            from agentkernel.pipeline.response_store.dynamodb import DynamoDBResponseStore
        return DynamoDBResponseStore.from_config(config.dynamodb, ttl=config.ttl)
    if kind == "postgres":
        if config.postgres is None:
            raise AKConfigError(_missing("postgres"))
        with require_extra("postgres", "execution.response_store.type: postgres"):
            from agentkernel.pipeline.response_store.postgres import PostgresResponseStore
        return PostgresResponseStore(config.postgres, ttl=config.ttl)
    if "." not in kind:
        raise AKConfigError(f"execution.response_store.type: unknown store '{kind}'")
    store: ResponseStore = resolve_dotted(kind, ResponseStore, "execution.response_store.type")()
    return store


def _missing(name: str) -> str:
    return (
        f"execution.response_store.{name}: block is required when "
        f"execution.response_store.type is '{name}'"
    )
