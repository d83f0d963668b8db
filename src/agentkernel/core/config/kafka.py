"""Where the Kafka transport keeps its delivery bookkeeping when the configuration leaves it open.

Kafka's bookkeeping (receive counts, finished records, dedup claims) must outlive a worker: a
replaced runner that forgot it re-reads every record behind the committed offset with its
receive counts reset. So ``execution.queues.kafka.bookkeeping: shared`` (the default) puts it
in the Redis server the deployment already uses for its session store, else for its response
store; with neither, the transport refuses to start (:func:`require_shared`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentkernel.core.errors import AKConfigError

if TYPE_CHECKING:
    from agentkernel.core.config.queues import KafkaQueueConfig
    from agentkernel.core.config.stores import ResponseStoreConfig, SessionConfig

#: The one-line reason a Kafka transport with nowhere to keep its bookkeeping refuses to start.
NO_SHARED_STORE = (
    "execution.queues.kafka.bookkeeping: 'shared' needs a Redis session or response store to "
    "keep Kafka delivery counts in, and this deployment has none; set bookkeeping: redis with "
    "bookkeeping_redis_url, or bookkeeping: in_memory to accept counts that reset on restart"
)


def share_bookkeeping(
    kafka: KafkaQueueConfig | None, session: SessionConfig, replies: ResponseStoreConfig
) -> None:
    """Resolve ``bookkeeping: shared`` to the deployment's Redis server, when it has one."""
    if kafka is None or kafka.bookkeeping != "shared":
        return
    if "bookkeeping_redis_url" in kafka.model_fields_set:
        kafka.bookkeeping = "redis"
        return
    for store in (session, replies):
        if store.type == "redis" and store.redis is not None:
            kafka.bookkeeping, kafka.bookkeeping_redis_url = "redis", store.redis.url
            return


def require_shared(kafka: KafkaQueueConfig) -> None:
    """Raise when ``bookkeeping: shared`` found no store to share.

    Raises:
        AKConfigError: one line naming what to configure.
    """
    if kafka.bookkeeping == "shared" and "bookkeeping_redis_url" not in kafka.model_fields_set:
        raise AKConfigError(NO_SHARED_STORE)
