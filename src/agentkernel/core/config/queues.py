"""The configuration models of the queues (``execution.queues``): the settings of each queue and
one block per broker.

All durations are float seconds.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from agentkernel.core.config.base import Block, known_kind
from agentkernel.core.config.stores import PostgresStoreConfig

#: The built-in values of ``execution.queues.type``.
TRANSPORTS = ("in_memory", "sqs", "nats", "kafka", "redis", "postgres")


class QueueSettings(Block):
    """Backend-neutral settings of one queue (``input`` or ``output``)."""

    url: str | None = Field(
        None, description="Queue address where the broker needs one (the SQS queue URL)."
    )
    max_receive_count: int = Field(
        3,
        ge=1,
        description="Deliveries allowed before the permanent-failure hook runs: with 3, a message "
        "is processed on deliveries 1-3 and answered with an error reply on delivery 4.",
    )
    no_of_consumers: int = Field(
        5, ge=1, description="Consumer threads per process polling this queue."
    )


class InputQueueSettings(QueueSettings):
    """``execution.queues.input``: the queue of chat turns, consumed by Agent Runners."""

    no_of_consumers: int = Field(
        5, ge=1, description="Agent Runner consumer threads per process polling INPUT."
    )


class OutputQueueSettings(QueueSettings):
    """``execution.queues.output``: the queue of replies, consumed by the IO process."""

    no_of_consumers: int = Field(
        2, ge=1, description="Response-handler consumer threads per IO process polling OUTPUT."
    )


class InMemoryQueueConfig(Block):
    """Tuning of the in-process transport (embedded topology, tests)."""

    ack_wait: float = Field(
        300.0, gt=0, description="Seconds a fetched, unacknowledged message stays invisible."
    )
    dedup_window: float = Field(
        300.0, ge=0, description="Seconds during which a repeated dedup_id is dropped at send."
    )


class SQSQueueConfig(Block):
    """Amazon SQS (FIFO) transport; the queue URLs come from ``input.url``/``output.url``."""

    region_name: str | None = Field(None, description="AWS region; default from the environment.")
    endpoint_url: str | None = Field(
        None, description="Override the SQS endpoint (a local test server such as moto)."
    )
    wait_time_seconds: float = Field(
        20.0, ge=0, le=20, description="Longest long poll per receive call, in seconds."
    )
    visibility_timeout: float | None = Field(
        30.0,
        gt=0,
        le=43200,
        description="Seconds a received message stays hidden (its lease, extended while the turn "
        "runs); short so a crashed runner costs seconds. null uses the queue's own setting.",
    )


class NatsQueueConfig(Block):
    """NATS JetStream transport: partitions owned by one consumer at a time, sessions in order."""

    url: str = Field("nats://127.0.0.1:4222", description="NATS server URL.")
    input_stream: str = Field("AGENT_REQUESTS", description="JetStream stream of the INPUT queue.")
    input_subject_prefix: str = Field("chat.req", description="Subject prefix of INPUT messages.")
    output_stream: str = Field("AGENT_REPLIES", description="JetStream stream of the OUTPUT queue.")
    output_subject_prefix: str = Field("chat.out", description="Subject prefix of OUTPUT messages.")
    partitions: int = Field(
        32,
        ge=1,
        description="Partitions per stream. Each is owned by one consumer at a time (runner "
        "replicas x no_of_consumers share them out), which runs each session's turns in order, "
        "one at a time; so it bounds the consumers that get work, not the turns in flight. Every "
        "process must use the stream's count: another one fails start-up, or /ready within 5 s "
        "when it changes.",
    )
    max_ack_pending: int = Field(
        128,
        ge=1,
        description="Messages of one partition its owner may hold unacknowledged at once: turns "
        "running plus turns waiting behind an earlier turn of their session. Bounds the turns in "
        "flight per partition (partitions x this for the deployment); set on the partition "
        "consumers by the processes consuming the queue.",
    )
    ack_wait: float = Field(
        30.0,
        gt=0,
        description="Seconds before an unacknowledged message is redelivered (its lease, extended "
        "while the turn runs); short so a crashed runner stalls its partitions for seconds. "
        "A queue's consumers are updated by the processes consuming it (or refused without "
        "auto_provision); a process whose consumers another one changed stops fetching.",
    )
    duplicate_window: float = Field(
        300.0, gt=0, description="Seconds the stream remembers a Nats-Msg-Id for dedup."
    )
    max_age: float = Field(86400.0, gt=0, description="Seconds a message may wait in a stream.")
    retry_backoff: float = Field(
        2.0, ge=0, description="Seconds a nacked message waits before it is redelivered."
    )
    request_timeout: float = Field(10.0, gt=0, description="Seconds to wait for a server reply.")
    connect_timeout: float = Field(
        5.0,
        gt=0,
        description="Seconds a starting process waits to reach the server; it then fails "
        "start-up. A connection lost later is retried without limit.",
    )
    auto_provision: bool = Field(
        False,
        description="Create missing streams and consumers (development). When false a missing "
        "one fails start-up with an error naming it.",
    )


class KafkaQueueConfig(Block):
    """Kafka transport; attempts and dedup are tracked in a bookkeeping store."""

    bootstrap_servers: str = Field("127.0.0.1:9092", description="Comma-separated brokers.")
    input_topic: str = Field("agent-input", description="Topic of the INPUT queue.")
    output_topic: str = Field("agent-output", description="Topic of the OUTPUT queue.")
    group_id: str = Field(
        "agentkernel", description="Consumer group prefix; '-input'/'-output' is appended."
    )
    dlq_suffix: str = Field(".dlq", description="Dead letters go to '<topic><dlq_suffix>'.")
    retry_backoff: float = Field(
        2.0, ge=0, description="Seconds before a nacked record is served again."
    )
    delivery_timeout: float = Field(
        30.0, gt=0, description="Seconds send() waits for the broker to confirm a record."
    )
    metadata_timeout: float = Field(5.0, gt=0, description="Seconds to wait for topic metadata.")
    dedup_window: float = Field(
        300.0, gt=0, description="Seconds a dedup_id is remembered (in the bookkeeping store)."
    )
    rebalance_drain_timeout: float = Field(
        30.0,
        ge=0,
        description="Seconds a consumer losing a partition waits for its in-flight records there "
        "to finish before handing the partition over.",
    )
    commit_timeout: float = Field(
        5.0,
        gt=0,
        description="Seconds a consumer giving up a partition (rebalance or close) waits for "
        "the broker to confirm its last commit there.",
    )
    auto_provision: bool = Field(
        False, description="Create missing topics (development); otherwise fail at start-up."
    )
    partitions: int = Field(8, ge=1, description="Partitions of topics created by auto_provision.")
    bookkeeping: Literal["shared", "redis", "in_memory"] = Field(
        "shared",
        description="Where receive counts, finished records and dedup claims live. 'shared': "
        "in Redis, at bookkeeping_redis_url when set, else on the session store's Redis, else "
        "the response store's; start-up fails when there is none. 'redis': at "
        "bookkeeping_redis_url. 'in_memory': forgotten when a worker restarts.",
    )
    bookkeeping_redis_url: str = Field(
        "redis://127.0.0.1:6379/0", description="Redis URL when bookkeeping is 'redis'."
    )
    client_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra librdkafka settings for the producer, consumers and admin client.",
    )
    consumer_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra librdkafka settings for consumers only (e.g. session.timeout.ms).",
    )


class RedisQueueConfig(Block):
    """Redis Streams transport: one FIFO stream per session, dispatched through a consumer group."""

    url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis URL: redis:// or rediss:// (TLS) for one server; redis+cluster:// or "
        "rediss+cluster:// for a Redis Cluster, naming any one node (the others are "
        "discovered; that node must answer at start-up).",
    )
    prefix: str = Field(
        "ak:q:",
        description="Prefix of every key; a queue's keys share the hash tag '{<prefix>input}' "
        "(or 'output'), so on a Redis Cluster each queue lives in one slot, served by one node.",
    )
    group: str = Field("agentkernel", description="Consumer group of both queues' ready streams.")
    ack_wait: float = Field(
        30.0,
        gt=0,
        description="Seconds a delivered message stays leased (extended while the turn runs); "
        "after it, any consumer claims it again (XAUTOCLAIM), so a crashed runner holds its "
        "sessions for at most this long.",
    )
    dedup_window: float = Field(
        300.0, gt=0, description="Seconds a dedup_id is remembered; a second send is dropped."
    )
    block_slice: float = Field(
        1.0,
        gt=0,
        le=5.0,
        description="Longest single blocking read, in seconds: a fetch looks for expired and "
        "nacked messages between slices, and notices that it is stopped within one.",
    )
    max_message_bytes: int = Field(
        1_048_576, ge=1, description="Largest body accepted by send; larger ones are refused."
    )
    dlq_max_length: int = Field(
        100_000,
        ge=1,
        description="Dead letters kept per queue in '<tag>:dlq' (approximate trim, oldest first).",
    )
    socket_timeout: float = Field(
        5.0,
        gt=0,
        description="Seconds to connect and to wait for an answer; an unreachable Redis fails "
        "a call within it. Must exceed block_slice.",
    )
    allow_eviction: bool = Field(
        False,
        description="Run on a server whose maxmemory-policy may evict keys (an evicted key "
        "loses queued messages). Off, such a server is refused at start-up; on, warned about.",
    )
    auto_provision: bool = Field(
        False,
        description="Create missing ready streams and consumer groups (development). When false "
        "a missing one fails start-up with an error naming it and the command that creates it.",
    )
    client_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments for redis.Redis.from_url (RedisCluster.from_url "
        "with a cluster URL), e.g. max_connections, ssl_ca_certs; protocol is always 2.",
    )


class PostgresQueueConfig(PostgresStoreConfig):
    """PostgreSQL transport: both queues in one table of ``db_schema`` (``agentkernel[postgres]``).

    The connection settings are those of a PostgreSQL store; the tables are created by
    ``agentkernel db migrate`` with the stores' (or by ``auto_provision`` in development).
    """

    input_queue: str = Field(
        "agent-input",
        min_length=1,
        max_length=200,
        description="Name of the INPUT queue inside the table (deployments sharing a schema "
        "use distinct names).",
    )
    output_queue: str = Field(
        "agent-output", min_length=1, max_length=200, description="Name of the OUTPUT queue."
    )
    ack_wait: float = Field(
        30.0,
        gt=0,
        description="Seconds a fetched message stays leased (its lease, extended while the turn "
        "runs); an unacknowledged one is delivered again after it, with its receive count raised.",
    )
    dedup_window: float = Field(
        300.0, ge=0, description="Seconds during which a repeated dedup_id is dropped at send."
    )
    max_age: float = Field(
        86400.0,
        gt=0,
        description="Seconds a message may wait in a queue before the sweeper deletes it.",
    )
    dead_letter_retention: float = Field(
        1209600.0,
        gt=0,
        description="Seconds a dead-lettered message is kept in the queue_dead table.",
    )


class QueuesConfig(Block):
    """``execution.queues``: which broker carries the INPUT and OUTPUT queues, and how."""

    type: Annotated[str, known_kind("transport", *TRANSPORTS)] = Field(
        "in_memory",
        description="Transport: in_memory, sqs, nats, kafka, redis, postgres, or a dotted path to "
        "a QueueTransport subclass.",
    )
    input: InputQueueSettings = Field(
        default_factory=InputQueueSettings, description="The INPUT queue (chat turns)."
    )
    output: OutputQueueSettings = Field(
        default_factory=OutputQueueSettings, description="The OUTPUT queue (replies)."
    )
    batch_size: int | None = Field(
        None,
        ge=1,
        le=10,
        description="Messages per fetch on both queues; unset means 1 on INPUT and 10 on OUTPUT.",
    )
    in_memory: InMemoryQueueConfig | None = Field(None, description="In-memory transport tuning.")

    sqs: SQSQueueConfig | None = Field(None, description="SQS transport settings.")
    nats: NatsQueueConfig | None = Field(None, description="NATS JetStream transport settings.")
    kafka: KafkaQueueConfig | None = Field(None, description="Kafka transport settings.")
    redis: RedisQueueConfig | None = Field(None, description="Redis Streams transport settings.")
    postgres: PostgresQueueConfig | None = Field(None, description="PostgreSQL transport settings.")
