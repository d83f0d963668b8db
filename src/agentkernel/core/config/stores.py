"""The configuration models of the stores: the response store (``execution.response_store``),
the session store (``session``) and the servers they use.

All durations are float seconds.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from agentkernel.core.config.base import Block, known_kind

#: The built-in values of ``execution.response_store.type`` and ``session.type``.
STORES = ("in_memory", "redis", "dynamodb", "postgres")


class PostgresStoreConfig(Block):
    """A PostgreSQL database used as a response or session store (``agentkernel[postgres]``)."""

    dsn: str = Field(
        "postgresql://127.0.0.1:5432/postgres",
        description="libpq connection string or URL (postgresql://user@host:port/dbname). Put "
        "the password in PGPASSWORD or a .pgpass file rather than here.",
    )
    db_schema: str = Field(
        "agentkernel",
        pattern=r"^[a-z_][a-z0-9_]{0,62}$",
        description="PostgreSQL schema holding the tables (created by 'agentkernel db "
        "migrate'); lower-case letters, digits and '_'. Stores of one deployment share it.",
    )
    pool_size: int = Field(
        10, ge=1, le=1000, description="Most connections each store opens (plus one listener)."
    )
    connect_timeout: float = Field(
        5.0,
        gt=0,
        le=300,
        description="Seconds to open a connection or wait for a free one in the pool; an "
        "unreachable server fails a store call after this long.",
    )
    statement_timeout: float = Field(
        5.0,
        gt=0,
        le=300,
        description="Seconds a statement may run before the server cancels it (and the client "
        "gives up on a silent connection a little later).",
    )
    sweep_interval: float = Field(
        60.0,
        gt=0,
        description="Seconds between two deletions of expired rows by each store's sweeper "
        "thread. Reads ignore expired rows whatever this is; it bounds only disk use.",
    )
    auto_provision: bool = Field(
        False,
        description="Create or upgrade the tables at start-up (development). Off, a missing or "
        "older schema fails start-up with the command to run: 'agentkernel db migrate'.",
    )


class RedisStoreConfig(Block):
    """A Redis server used as a response or session store."""

    url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis URL: redis:// or rediss:// for one server; redis+cluster:// or "
        "rediss+cluster:// for a Redis Cluster, naming any one node (then the prefix needs a "
        "hash tag).",
    )
    prefix: str = Field(
        "ak:",
        description="Prefix of every key written. On a Redis Cluster it must carry a hash tag "
        "(e.g. '{ak}:'): the store's scripts touch several keys at once, so all of them live in "
        "the tag's slot, on one node.",
    )
    allow_eviction: bool = Field(
        False,
        description="Start even though the server's maxmemory-policy may evict keys (anything "
        "but noeviction). Off, such a server is refused at start-up: an evicted session or "
        "ticket could not be told from a new one. On, it is a warning in the log and in /ready.",
    )


class ResponseRedisConfig(RedisStoreConfig):
    """The Redis server of the response store."""

    upstream_prefix: str | None = Field(
        None,
        min_length=1,
        description="Also read replies written by upstream agentkernel 0.9.5, at "
        "'<upstream_prefix><request_id>' (upstream's default prefix is 'ak:responses:'), so "
        "turns accepted before a migration can still be polled after it; remove it once "
        "those replies have expired. Replies are always written as '<prefix>resp:<request_id>'.",
    )


class DynamoDBStoreConfig(Block):
    """A DynamoDB table used as a response or session store."""

    table_name: str | None = Field(
        None,
        description="Table name; its string partition key is request_id (response store) or "
        "session_id (session store), and expiry_time is its TTL attribute. A session table "
        "also needs the global secondary index by_owner (owner_scope string, active_at number, "
        "keys only) for GET /api/v1/sessions.",
    )
    region_name: str | None = Field(None, description="AWS region; default from the environment.")
    endpoint_url: str | None = Field(None, description="Override the endpoint (local servers).")


class ResponseStoreConfig(Block):
    """``execution.response_store``: where replies wait to be read."""

    type: Annotated[str, known_kind("response store", *STORES)] = Field(
        "in_memory",
        description="in_memory, redis, dynamodb, postgres, or a dotted path to a ResponseStore.",
    )
    ttl: float = Field(
        3600.0,
        gt=0,
        description="Seconds a reply stays readable. At least the transport's dedup window "
        "(start-up fails otherwise): a retry inside the window is dropped by the broker, so its "
        "stored reply is the only answer it can get.",
    )
    redis: ResponseRedisConfig | None = Field(None, description="Redis response store settings.")

    dynamodb: DynamoDBStoreConfig | None = Field(None, description="DynamoDB store settings.")
    postgres: PostgresStoreConfig | None = Field(
        None, description="PostgreSQL response store settings."
    )
    retry_count: int | None = Field(
        None,
        ge=1,
        description="Upstream compatibility: with delay, bounds a sync request's wait to "
        "retry_count x delay seconds where the store has no push (DynamoDB). Prefer "
        "api.sync_timeout.",
    )
    delay: float | None = Field(
        None, gt=0, description="Upstream compatibility: seconds per retry_count step."
    )

    def sync_wait(self, sync_timeout: float, pushes: bool) -> float:
        """Seconds a sync request waits: ``retry_count x delay`` bounds stores without push."""
        if pushes or self.retry_count is None or self.delay is None:
            return sync_timeout
        return min(sync_timeout, self.retry_count * self.delay)


#: An entry of ``session.adopt_unscoped``: a scheme, or a scheme and an issuer (escaped as in an
#: identity, so it holds no further ``:``).
AdoptionScheme = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]*(:[^:\s]+)?$")]


class SessionConfig(Block):
    """``session``: where agents keep per-session state between turns."""

    type: Annotated[str, known_kind("session store", *STORES)] = Field(
        "in_memory",
        description="in_memory, redis, dynamodb, postgres, or a dotted path to a SessionStore.",
    )
    ttl: float = Field(604800.0, gt=0, description="Seconds a session's state is kept.")
    redis: RedisStoreConfig | None = Field(None, description="Redis session store settings.")
    dynamodb: DynamoDBStoreConfig | None = Field(None, description="DynamoDB session settings.")
    postgres: PostgresStoreConfig | None = Field(
        None, description="PostgreSQL session store settings."
    )
    adopt_unscoped: list[AdoptionScheme] = Field(
        default_factory=list,
        description="After upgrading to sessions scoped per identity: the identity schemes "
        "('key', 'jwt', 'token', 'lambda'), or schemes and issuers as written in identities "
        "('jwt:https%3A//idp.example/'), whose callers adopt their session stored before, when "
        "its recorded owner is their user id. Empty: old sessions are not adopted. See "
        "docs/authentication.md.",
    )
