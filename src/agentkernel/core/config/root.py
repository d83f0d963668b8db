"""Configuration: ``config.yaml`` plus ``AK_`` environment variables.

Sources, lowest priority first: field defaults, the YAML file (``config.yaml`` in the working
directory, or the path in ``AK_CONFIG_PATH_OVERRIDE``), then environment variables named
``AK_<SECTION>__<KEY>`` with ``__`` between nesting levels (``AK_EXECUTION__QUEUES__BATCH_SIZE``).
All durations are float seconds. An invalid value raises :class:`AKConfigError` naming the key.
"""

from __future__ import annotations

import logging
import os
import threading
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from agentkernel.core.config.auth import (
    ApiKeyConfig,
    AuthConfig,
    JwtAlgorithm,
    JwtConfig,
    WebSocketConfig,
)
from agentkernel.core.config.backends import (
    Block as _Block,
)
from agentkernel.core.config.backends import (
    DynamoDBStoreConfig,
    InMemoryQueueConfig,
    InputQueueSettings,
    KafkaQueueConfig,
    NatsQueueConfig,
    OutputQueueSettings,
    PostgresQueueConfig,
    PostgresStoreConfig,
    QueuesConfig,
    QueueSettings,
    RedisQueueConfig,
    RedisStoreConfig,
    ResponseRedisConfig,
    ResponseStoreConfig,
    SQSQueueConfig,
    check_kind,
)
from agentkernel.core.config.env import describe_unparsable, variable_for
from agentkernel.core.config.kafka import share_bookkeeping
from agentkernel.core.config.limits import LimitsConfig
from agentkernel.core.config.rules import check_reply_ttl
from agentkernel.core.config.turns import MultitaskStrategy, TurnControlConfig
from agentkernel.core.config.webhooks import WebhooksConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.core.extras import require_extra
from agentkernel.core.upstream import closest_key, drop_upstream_keys

__all__ = [
    "AKConfig",
    "AKConfigError",
    "ApiKeyConfig",
    "AuthConfig",
    "DynamoDBStoreConfig",
    "ExecutionMode",
    "InMemoryQueueConfig",
    "InputQueueSettings",
    "JwtAlgorithm",
    "JwtConfig",
    "KafkaQueueConfig",
    "LimitsConfig",
    "MultitaskStrategy",
    "NatsQueueConfig",
    "OutputQueueSettings",
    "PostgresQueueConfig",
    "PostgresStoreConfig",
    "QueueSettings",
    "QueuesConfig",
    "RedisQueueConfig",
    "RedisStoreConfig",
    "ResponseRedisConfig",
    "ResponseStoreConfig",
    "SQSQueueConfig",
    "TurnControlConfig",
    "WebSocketConfig",
    "WebhooksConfig",
    "require_extra",
]

logger = logging.getLogger(__name__)

CONFIG_PATH_ENV = "AK_CONFIG_PATH_OVERRIDE"
DEFAULT_CONFIG_PATH = "config.yaml"


#: Turns one runner process keeps in flight by default on a broker, where each holds a lease.
BROKER_MAX_IN_FLIGHT = 256
#: The same on the in-memory transport (``agentkernel serve``), where no turn holds a lease.
IN_PROCESS_MAX_IN_FLIGHT = 10_000


class RunnerConfig(_Block):
    """``execution.runner``: how an Agent Runner process executes turns."""

    max_in_flight: int | None = Field(
        None,
        ge=1,
        description="Turns one runner process keeps running at once (asyncio), across all its "
        "consumer threads; independent of no_of_consumers. Unset: 256 on a broker, where each "
        "turn in flight holds a lease the broker must track; 10000 on the in-memory transport "
        "(agentkernel serve), where a turn waits in the process's memory whether it runs or "
        "not: about 3 KB queued, 12 KB running, besides what its agent holds.",
    )
    lease_extension: bool = Field(
        True,
        description="Extend the message lease (visibility timeout, ack wait) while a turn runs, "
        "so a long turn is not delivered twice.",
    )
    turn_timeout: float | None = Field(
        None,
        gt=0,
        description="Seconds a turn may run before it is cancelled and answered 504 "
        "TURN_TIMEOUT (not retried); an Agent's own timeout wins. Unset: no limit.",
    )
    stall_warning: float | None = Field(
        0.1,
        gt=0,
        description="Warn (naming the agent and request) when code running on the runner's event "
        "loop blocks it longer than this many seconds; async agents must not block. Unset: off.",
    )
    isolate_last_attempt: bool = Field(
        True,
        description="Run a turn on its last allowed delivery alone in its runner process, so a "
        "turn that crashes the process (a poison turn) cannot use up the deliveries of turns "
        "that were only running beside it.",
    )
    drain_timeout: float = Field(
        20.0,
        gt=0,
        description="Seconds a stopping runner waits for its turns in flight (and, embedded, the "
        "turns still queued) to finish. Turns still unfinished are logged by request id and "
        "handed back to the broker for another runner.",
    )
    health_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="TCP port on which a runner process (agentkernel runner, "
        "ECSAgentRunner.run) answers GET /health, /ready and /metrics (Prometheus text). Unset: "
        "no port. The container recipes set 8001.",
    )
    health_host: str = Field(
        "127.0.0.1",
        description="Interface of the runner's health port; 0.0.0.0 in a container, so probes "
        "and scrapers reach it.",
    )

    def in_flight_limit(self, queues_in_process: bool) -> int:
        """``max_in_flight``, or when it is unset the default for where the queues live.

        Args:
            queues_in_process: the transport keeps its queues in this process (in-memory).
        """
        if self.max_in_flight is not None:
            return self.max_in_flight
        return IN_PROCESS_MAX_IN_FLIGHT if queues_in_process else BROKER_MAX_IN_FLIGHT


class ExecutionMode(StrEnum):
    """The values of ``execution.mode``, by the names upstream code compares them with.

    The setting itself stays a plain string (``config.execution.mode == "rest_async"``); a member
    equals its value, so ``mode == ExecutionMode.REST_ASYNC`` holds as well, and a member may be
    assigned where the setting is built.
    """

    REST_SYNC = "rest_sync"
    REST_ASYNC = "rest_async"
    ASYNC = "async"
    STREAM = "stream"


class ExecutionConfig(_Block):
    """``execution``: the pipeline between the API and the agents."""

    mode: Literal["rest_sync", "rest_async", "async", "stream"] = Field(
        "rest_sync",
        description="Default reply mode of POST /api/v1/chat: rest_sync waits for the reply, "
        "rest_async answers 202 at once. A client can ask for async per request with "
        "'Prefer: respond-async'. async and stream are the serverless WebSocket modes (replies "
        "pushed to the connection; stream pushes chunks); a REST POST answers 202 in them.",
    )
    queues: QueuesConfig = Field(default_factory=QueuesConfig, description="Queue transport.")
    response_store: ResponseStoreConfig = Field(
        default_factory=ResponseStoreConfig, description="Reply store."
    )
    runner: RunnerConfig = Field(default_factory=RunnerConfig, description="Agent Runner tuning.")
    turn_control: TurnControlConfig = Field(
        default_factory=TurnControlConfig, description="Cancelling turns, multitask strategies."
    )

    @model_validator(mode="after")
    def _replies_outlive_the_dedup_window(self) -> ExecutionConfig:
        check_reply_ttl(self.queues, self.response_store)
        return self


#: An entry of ``session.adopt_unscoped``: a scheme, or a scheme and an issuer (escaped as in an
#: identity, so it holds no further ``:``).
AdoptionScheme = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]*(:[^:\s]+)?$")]


class SessionConfig(_Block):
    """``session``: where agents keep per-session state between turns."""

    type: str = Field(
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

    @field_validator("type")
    @classmethod
    def _known_store(cls, kind: str) -> str:
        return check_kind(kind, ("in_memory", "redis", "dynamodb", "postgres"), "session store")


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
    body_timeout: float = Field(
        5.0,
        gt=0,
        description="Seconds a client may take to send a whole request body; a slower body is "
        "answered 408 and the connection closed.",
    )
    shutdown_timeout: float = Field(
        5.0,
        ge=0,
        description="Seconds a stopping IO process keeps waiting rest_sync requests open for "
        "their replies (after an embedded runner has drained); the rest are answered 503 "
        "SHUTTING_DOWN with the request_id and a Location to poll.",
    )
    stream_heartbeat: float = Field(
        15.0,
        gt=0,
        description="Seconds of silence after which a Server-Sent Events stream gets a "
        "keep-alive comment, so proxies do not close it.",
    )
    ws_max_turns: int = Field(
        32, ge=1, description="Turns one WebSocket connection may have open at once."
    )
    websocket: WebSocketConfig = Field(
        default_factory=WebSocketConfig, description="Serverless WebSocket connections."
    )
    auth: AuthConfig = Field(default_factory=AuthConfig, description="Authentication.")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Limits (429, 408).")
    webhooks: WebhooksConfig = Field(
        default_factory=WebhooksConfig, description="Completion webhooks (off without a secret)."
    )
    access_log: bool = Field(
        False,
        description="Log one line per request and WebSocket connection (logger "
        "agentkernel.access): client, method, path, status, milliseconds, request_id, user.",
    )
    playground: bool | None = Field(
        None,
        description="Serve the playground page at /playground (and redirect / to it): a small "
        "browser page to chat with the agents, watch replies stream and see the pipeline's "
        "metrics. The page and its two static files are public; every API call it makes sends "
        "the credential typed into it. Unset: on where the process runs the agents itself "
        "(agentkernel serve), off for an IO process alone (agentkernel io, ECSIOHandler).",
    )
    idempotency_secret: SecretStr | None = Field(
        None,
        description="Secret mixed into request ids derived from an Idempotency-Key, so nobody "
        "can compute another client's request id; give every IO process the same one. Unset: "
        "a random secret the response store keeps for the deployment.",
    )


class LoggerConfig(_Block):
    """A logger's settings."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", description="Lowest level logged."
    )


class LoggingConfig(_Block):
    """``logging``: log output, applied by the ``agentkernel`` command and, when nothing set up
    logging before, by the container entry points (``ECSIOHandler.run``, ``ECSAgentRunner.run``)."""

    ak: LoggerConfig = Field(
        default_factory=LoggerConfig, description="The agentkernel loggers (``agentkernel.*``)."
    )
    format: Literal["text", "json"] = Field(
        "text",
        description="text: one line per record (time, level, thread, logger, message). json: one "
        "JSON object per line with time, level, logger, thread, message and, when known, "
        "request_id, session_id and trace_id, for a log platform to ingest.",
    )


class AKConfig(BaseSettings):
    """The whole configuration; obtain the process-wide instance with :meth:`get`."""

    model_config = SettingsConfigDict(
        env_prefix="AK_", env_nested_delimiter="__", extra="ignore", case_sensitive=False
    )

    execution: ExecutionConfig = Field(default_factory=ExecutionConfig, description="Pipeline.")
    session: SessionConfig = Field(default_factory=SessionConfig, description="Session state.")
    api: ApiConfig = Field(default_factory=ApiConfig, description="HTTP server.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Log output.")

    _instance: ClassVar[AKConfig | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _yaml_path: ClassVar[Path | None] = None

    @model_validator(mode="before")
    @classmethod
    def _read_upstream_files(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = drop_upstream_keys(data)
        for key in data:
            if key not in cls.model_fields:
                near = closest_key(cls, (key,))
                hint = f"; did you mean {near}?" if near else ""
                raise AKConfigError(f"invalid configuration: {key}: unknown key{hint}")
        return data

    @model_validator(mode="after")
    def _warn_about_ignored_bounds(self) -> AKConfig:
        store = self.execution.response_store
        if (store.retry_count or store.delay) and store.type in ("in_memory", "redis"):
            logger.warning(
                "execution.response_store.retry_count/delay are deprecated and have no effect "
                "with the %s store, which pushes replies; api.sync_timeout bounds the wait",
                store.type,
            )
        return self

    @model_validator(mode="after")
    def _share_kafka_bookkeeping(self) -> AKConfig:
        queues, store = self.execution.queues, self.execution.response_store
        share_bookkeeping(queues.kafka, self.session, store)
        return self

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
            problem = "is not a file" if yaml_path.exists() else "does not exist"
            raise AKConfigError(
                f"config file '{yaml_path}' {problem} (named by --config or {CONFIG_PATH_ENV})"
            )
        cls._yaml_path = yaml_path if yaml_path.is_file() else None
        try:
            if cls._yaml_path is not None:
                _check_top_level(cls._yaml_path)
            return cls()
        except ValidationError as exc:
            raise AKConfigError(_describe(exc)) from exc
        except SettingsError as exc:  # an AK_ variable that should hold JSON does not
            raise AKConfigError(describe_unparsable(AKConfig, exc)) from exc
        except (ValueError, OSError, yaml.YAMLError) as exc:  # unreadable YAML
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


def _check_top_level(path: Path) -> None:
    """The file must be a mapping of sections (or empty): a list or a scalar is refused by name.

    Raises:
        AKConfigError: the top level of the file is something else.
    """
    with path.open(encoding="utf-8") as stream:
        doc = yaml.safe_load(stream)
    if doc is not None and not isinstance(doc, dict):
        sections = ", ".join(AKConfig.model_fields)
        kind = "list" if isinstance(doc, list) else type(doc).__name__
        raise AKConfigError(
            f"{path}: the top level must be a mapping of sections ({sections}), not a {kind}"
        )


def _describe(exc: ValidationError) -> str:
    """One line per invalid key, as ``execution.queues.input.no_of_consumers: <reason>``; a key
    an ``AK_`` variable set names the variable."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(part) for part in err["loc"]) or "<root>"
        if variable := variable_for(err["loc"]):
            key = f"{key} (from {variable})"
        reason = _reason(err)
        if err["type"] == "extra_forbidden" and (near := closest_key(AKConfig, err["loc"])):
            reason = f"unknown key; did you mean {near}?"
        lines.append(f"{key}: {reason}")
    return "invalid configuration: " + "; ".join(lines)


def describe_block(exc: ValidationError, path: str) -> str:
    """The errors of a block validated on its own (not through :class:`AKConfig`), each key
    named under ``path``: ``sandbox.queue.type: unknown transport 'x'``."""
    return "; ".join(
        ".".join([path, *(str(part) for part in err["loc"])]) + f": {_reason(err)}"
        for err in exc.errors()
    )


def _reason(err: Any) -> str:
    if err["type"] == "value_error" and "error" in err.get("ctx", {}):
        return str(err["ctx"]["error"])  # our own check's words, without a prefix
    return "unknown key" if err["type"] == "extra_forbidden" else str(err["msg"])


# The names upstream agentkernel gives these models (its transport guide tells users to build
# ``_QueuesConfig``-shaped blocks). Aliases of the models above, not copies: one class each.
_QueuesConfig = QueuesConfig
_InputQueueConfig = InputQueueSettings
_OutputQueueConfig = OutputQueueSettings
_InMemoryQueueConfig = InMemoryQueueConfig
_NatsQueueConfig = NatsQueueConfig
_KafkaQueueConfig = KafkaQueueConfig
_ResponseStoreConfig = ResponseStoreConfig
_ResponseStoreRedisConfig = ResponseRedisConfig
_ResponseStoreValkeyConfig = ResponseRedisConfig
_ResponseStoreDynamoDBConfig = DynamoDBStoreConfig
_RedisConfig = RedisStoreConfig
_ValkeyConfig = RedisStoreConfig
_DynamoDBConfig = DynamoDBStoreConfig
_SessionStoreConfig = SessionConfig
_ExecutionConfig = ExecutionConfig
_APIConfig = ApiConfig
_LoggingConfig = LoggingConfig
_LogLevelConfig = LoggerConfig
