"""Session stores: where agents keep per-session state between turns."""

from __future__ import annotations

from agentkernel.core.config.stores import SessionConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.core.extras import require_extra, resolve_dotted
from agentkernel.pipeline.session_store.base import SessionRecord, SessionStore, TurnOutcome

__all__ = ["SessionRecord", "SessionStore", "TurnOutcome", "create_session_store"]


def create_session_store(config: SessionConfig) -> SessionStore:
    """Build the session store named by ``session.type``.

    Raises:
        AKConfigError: unknown type, missing backend block, or a bad dotted path.
    """
    if config.type == "in_memory":
        from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore

        return InMemorySessionStore(ttl=config.ttl)
    if config.type == "redis":
        if config.redis is None:
            raise AKConfigError("session.redis: block is required when session.type is 'redis'")
        with require_extra("redis", "session.type: redis"):
            from agentkernel.pipeline.session_store.redis import RedisSessionStore
        redis = config.redis
        return RedisSessionStore(
            redis.url, redis.prefix, config.ttl, allow_eviction=redis.allow_eviction
        )
    if config.type == "dynamodb":
        if config.dynamodb is None or not config.dynamodb.table_name:
            raise AKConfigError(
                "session.dynamodb.table_name: required when session.type is 'dynamodb'"
            )
        with require_extra("dynamodb", "session.type: dynamodb"):
            from agentkernel.pipeline.session_store.dynamodb import DynamoDBSessionStore
        db = config.dynamodb
        return DynamoDBSessionStore(
            db.table_name or "", config.ttl, db.region_name, db.endpoint_url
        )
    if config.type == "postgres":
        if config.postgres is None:
            raise AKConfigError(
                "session.postgres: block is required when session.type is 'postgres'"
            )
        with require_extra("postgres", "session.type: postgres"):
            from agentkernel.pipeline.session_store.postgres import PostgresSessionStore
        return PostgresSessionStore(config.postgres, ttl=config.ttl)
    if "." not in config.type:
        raise AKConfigError(f"session.type: unknown session store '{config.type}'")
    store: SessionStore = resolve_dotted(config.type, SessionStore, "session.type")()
    return store
