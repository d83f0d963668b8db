"""Configuration: ``config.yaml`` plus ``AK_`` environment variables.

Sources, lowest priority first: field defaults, the YAML file (``config.yaml`` in the working
directory, or the path in ``AK_CONFIG_PATH_OVERRIDE``), then environment variables named
``AK_<SECTION>__<KEY>`` with ``__`` between nesting levels (``AK_EXECUTION__QUEUES__BATCH_SIZE``).
All durations are float seconds. An invalid value raises :class:`AKConfigError` naming the key.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from agentkernel.core.errors import AKConfigError
from agentkernel.core.extras import require_extra

__all__ = ["AKConfig", "AKConfigError", "require_extra"]

CONFIG_PATH_ENV = "AK_CONFIG_PATH_OVERRIDE"
DEFAULT_CONFIG_PATH = "config.yaml"


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QueueSettings(_Block):
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


class InMemoryQueueConfig(_Block):
    """Tuning of the in-process transport (embedded topology, tests)."""

    ack_wait: float = Field(
        300.0, gt=0, description="Seconds a fetched, unacknowledged message stays invisible."
    )
    dedup_window: float = Field(
        300.0, ge=0, description="Seconds during which a repeated dedup_id is dropped at send."
    )


class SQSQueueConfig(_Block):
    """Amazon SQS (FIFO) transport; the queue URLs come from ``input.url``/``output.url``."""

    region_name: str | None = Field(None, description="AWS region; default from the environment.")
    endpoint_url: str | None = Field(
        None, description="Override the SQS endpoint (a local test server such as moto)."
    )
    wait_time_seconds: float = Field(
        20.0, ge=0, le=20, description="Longest long poll per receive call, in seconds."
    )
    visibility_timeout: float | None = Field(
        None,
        gt=0,
        description="Seconds a received message stays hidden; default: the queue's own setting.",
    )


class NatsQueueConfig(_Block):
    """NATS JetStream transport with client-side per-session partitions."""

    url: str = Field("nats://127.0.0.1:4222", description="NATS server URL.")
    input_stream: str = Field("AGENT_REQUESTS", description="JetStream stream of the INPUT queue.")
    input_subject_prefix: str = Field("chat.req", description="Subject prefix of INPUT messages.")
    output_stream: str = Field("AGENT_REPLIES", description="JetStream stream of the OUTPUT queue.")
    output_subject_prefix: str = Field("chat.out", description="Subject prefix of OUTPUT messages.")
    partitions: int = Field(
        32,
        ge=1,
        description="Partitions per stream; one message per partition is in flight at a time, so "
        "this bounds the turns running at once across the whole deployment.",
    )
    ack_wait: float = Field(
        300.0, gt=0, description="Seconds before an unacknowledged message is redelivered."
    )
    duplicate_window: float = Field(
        300.0, gt=0, description="Seconds the stream remembers a Nats-Msg-Id for dedup."
    )
    max_age: float = Field(86400.0, gt=0, description="Seconds a message may wait in a stream.")
    retry_backoff: float = Field(
        2.0, ge=0, description="Seconds a nacked message waits before it is redelivered."
    )
    request_timeout: float = Field(10.0, gt=0, description="Seconds to wait for a server reply.")
    auto_provision: bool = Field(
        False,
        description="Create missing streams and consumers (development). When false a missing "
        "one fails start-up with an error naming it.",
    )


class KafkaQueueConfig(_Block):
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
    bookkeeping: Literal["in_memory", "redis"] = Field(
        "in_memory",
        description="Where receive counts and dedup claims live; 'redis' survives worker restarts.",
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


class QueuesConfig(_Block):
    """``execution.queues``: which broker carries the INPUT and OUTPUT queues, and how."""

    type: str = Field(
        "in_memory",
        description="Transport: in_memory, sqs, nats, kafka, or a dotted path to a "
        "QueueTransport subclass.",
    )
    input: InputQueueSettings = Field(
        default_factory=InputQueueSettings, description="The INPUT queue (chat turns)."
    )
    output: OutputQueueSettings = Field(
        default_factory=OutputQueueSettings, description="The OUTPUT queue (replies)."
    )
    batch_size: int | None = Field(
        None, ge=1, le=10, description="Messages per fetch on both queues; unset means 1."
    )
    in_memory: InMemoryQueueConfig | None = Field(None, description="In-memory transport tuning.")
    sqs: SQSQueueConfig | None = Field(None, description="SQS transport settings.")
    nats: NatsQueueConfig | None = Field(None, description="NATS JetStream transport settings.")
    kafka: KafkaQueueConfig | None = Field(None, description="Kafka transport settings.")


class RedisStoreConfig(_Block):
    """A Redis server used as a response or session store."""

    url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL.")
    prefix: str = Field("ak:", description="Prefix of every key written.")


class DynamoDBStoreConfig(_Block):
    """A DynamoDB table used as a response or session store."""

    table_name: str | None = Field(
        None,
        description="Table name; its string partition key is request_id (response store) or "
        "session_id (session store), and expiry_time is its TTL attribute.",
    )
    region_name: str | None = Field(None, description="AWS region; default from the environment.")
    endpoint_url: str | None = Field(None, description="Override the endpoint (local servers).")


class ResponseStoreConfig(_Block):
    """``execution.response_store``: where replies wait to be read."""

    type: str = Field(
        "in_memory", description="in_memory, redis, dynamodb, or a dotted path to a ResponseStore."
    )
    ttl: float = Field(3600.0, gt=0, description="Seconds a reply stays readable.")
    redis: RedisStoreConfig | None = Field(None, description="Redis response store settings.")
    dynamodb: DynamoDBStoreConfig | None = Field(None, description="DynamoDB store settings.")


class RunnerConfig(_Block):
    """``execution.runner``: how an Agent Runner process executes turns."""

    max_in_flight: int = Field(
        256,
        ge=1,
        description="Turns one runner process keeps running at once (asyncio), across all its "
        "consumer threads; independent of no_of_consumers.",
    )
    lease_extension: bool = Field(
        True,
        description="Extend the message lease (visibility timeout, ack wait) while a turn runs, "
        "so a long turn is not delivered twice.",
    )


class ExecutionConfig(_Block):
    """``execution``: the pipeline between the API and the agents."""

    mode: Literal["rest_sync", "rest_async"] = Field(
        "rest_sync",
        description="Default reply mode of POST /api/v1/chat: rest_sync waits for the reply, "
        "rest_async answers 202 at once. A client can ask for async per request with "
        "'Prefer: respond-async'.",
    )
    queues: QueuesConfig = Field(default_factory=QueuesConfig, description="Queue transport.")
    response_store: ResponseStoreConfig = Field(
        default_factory=ResponseStoreConfig, description="Reply store."
    )
    runner: RunnerConfig = Field(default_factory=RunnerConfig, description="Agent Runner tuning.")


class SessionConfig(_Block):
    """``session``: where agents keep per-session state between turns."""

    type: str = Field(
        "in_memory", description="in_memory, redis, dynamodb, or a dotted path to a SessionStore."
    )
    ttl: float = Field(604800.0, gt=0, description="Seconds a session's state is kept.")
    redis: RedisStoreConfig | None = Field(None, description="Redis session store settings.")
    dynamodb: DynamoDBStoreConfig | None = Field(None, description="DynamoDB session settings.")


class ApiConfig(_Block):
    """``api``: the HTTP server of the IO process."""

    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to listen on (0 = any free).")
    max_body_bytes: int = Field(
        1_048_576, ge=1, description="Largest accepted request body in bytes; larger is 413."
    )
    sync_timeout: float = Field(
        60.0, gt=0, description="Seconds a rest_sync request waits for its reply before 504."
    )
    enqueue_timeout: float = Field(
        5.0, gt=0, description="Seconds an enqueue may take before the request fails with 503."
    )


class AKConfig(BaseSettings):
    """The whole configuration; obtain the process-wide instance with :meth:`get`."""

    model_config = SettingsConfigDict(
        env_prefix="AK_", env_nested_delimiter="__", extra="ignore", case_sensitive=False
    )

    execution: ExecutionConfig = Field(default_factory=ExecutionConfig, description="Pipeline.")
    session: SessionConfig = Field(default_factory=SessionConfig, description="Session state.")
    api: ApiConfig = Field(default_factory=ApiConfig, description="HTTP server.")

    _instance: ClassVar[AKConfig | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _yaml_path: ClassVar[Path | None] = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if cls._yaml_path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=cls._yaml_path))
        return tuple(sources)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> AKConfig:
        """Build a configuration from the YAML file and the environment.

        Args:
            path: YAML file to read; default ``AK_CONFIG_PATH_OVERRIDE`` or ``./config.yaml``.
                An explicitly named file must exist; the default one is optional.

        Raises:
            AKConfigError: the file is missing or unreadable, or a value is invalid.
        """
        explicit = path or os.environ.get(CONFIG_PATH_ENV)
        yaml_path = Path(explicit or DEFAULT_CONFIG_PATH)
        if explicit and not yaml_path.is_file():
            raise AKConfigError(f"{CONFIG_PATH_ENV}: config file '{yaml_path}' does not exist")
        cls._yaml_path = yaml_path if yaml_path.is_file() else None
        try:
            return cls()
        except ValidationError as exc:
            raise AKConfigError(_describe(exc)) from exc
        except (ValueError, OSError, yaml.YAMLError) as exc:  # unreadable or non-mapping YAML
            raise AKConfigError(f"{yaml_path}: cannot read configuration: {exc}") from exc
        finally:
            cls._yaml_path = None

    @classmethod
    def get(cls) -> AKConfig:
        """Return the process-wide configuration, loading it on first use."""
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls.load()
            return cls._instance

    @classmethod
    def set(cls, config: AKConfig) -> None:
        """Install ``config`` as the process-wide configuration (embedding, tests)."""
        with cls._lock:
            cls._instance = config

    @classmethod
    def reset(cls) -> None:
        """Forget the process-wide configuration so the next :meth:`get` reloads it."""
        with cls._lock:
            cls._instance = None


def _describe(exc: ValidationError) -> str:
    """One line per invalid key, as ``execution.queues.input.no_of_consumers: <reason>``."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(part) for part in err["loc"]) or "<root>"
        lines.append(f"{key}: {err['msg']}")
    return "invalid configuration: " + "; ".join(lines)
