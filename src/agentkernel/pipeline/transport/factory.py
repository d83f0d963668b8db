"""Which transport a configuration names: :class:`QueueTransportFactory`.

The one module that knows every broker; each is imported only when configured, behind its
extra. No transport imports this module.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError

from agentkernel.core.config.queues import QueuesConfig
from agentkernel.core.config.root import AKConfig, describe_block
from agentkernel.core.errors import AKConfigError
from agentkernel.core.extras import require_extra, resolve_dotted
from agentkernel.pipeline.transport.base import (
    QueueTransport,
    TransportConsumer,
    require_block,
    require_queue_urls,
)
from agentkernel.pipeline.transport.blocking import AnyTransport
from agentkernel.pipeline.wire.envelope import QueueName

__all__ = ["DEFAULT_CONFIG_PATH", "QueueTransportFactory", "QueuesConfigLike"]

QueuesConfigLike = QueuesConfig | BaseModel | Mapping[str, Any]

#: Where the factory reads its block when none is handed to it.
DEFAULT_CONFIG_PATH = "execution.queues"


class QueueTransportFactory:
    """Build the transport named by ``execution.queues.type``, or by a block of the same shape.

    A component with a queues block of its own (upstream's sandbox broker reads
    ``sandbox.broker.queue``) passes it as ``queues_config`` and names where it sits as
    ``config_path``: every configuration error raised while building the transport (and, through
    :meth:`create_consumer`, its consumer) then names keys under that path. Without a block the
    factory reads ``execution.queues`` of :class:`AKConfig`.
    """

    _BUILTIN_TYPES: ClassVar[tuple[str, ...]] = (
        "in_memory",
        "sqs",
        "nats",
        "kafka",
        "redis",
        "postgres",
    )

    @staticmethod
    def _block(
        queues_config: QueuesConfigLike | None, config_path: str = DEFAULT_CONFIG_PATH
    ) -> QueuesConfig:
        if queues_config is None:
            return AKConfig.get().execution.queues
        if isinstance(queues_config, QueuesConfig):
            return queues_config
        if isinstance(queues_config, BaseModel):  # a block of another model of the same shape
            queues_config = queues_config.model_dump(exclude_unset=True)
        if not isinstance(queues_config, Mapping):
            raise AKConfigError(
                f"{config_path}: expected a queues block (mapping), got "
                f"{type(queues_config).__name__}"
            )
        try:
            return QueuesConfig.model_validate(dict(queues_config))
        except ValidationError as exc:
            raise AKConfigError(describe_block(exc, config_path)) from exc

    @classmethod
    def resolve_type(
        cls, queues_config: QueuesConfigLike | None = None, config_path: str = DEFAULT_CONFIG_PATH
    ) -> str:
        """Return the configured transport type name."""
        return cls._block(queues_config, config_path).type

    @classmethod
    def create(
        cls, queues_config: QueuesConfigLike | None = None, config_path: str = DEFAULT_CONFIG_PATH
    ) -> AnyTransport:
        """Create the configured transport.

        Args:
            queues_config: a block shaped like ``execution.queues`` (model or mapping); ``None``
                reads ``execution.queues``.
            config_path: where that block sits in the configuration, for error messages.

        Raises:
            AKConfigError: unknown type, missing config block, or a bad dotted path; the
                message names the key under ``config_path``.
            ImportError: the transport's extra is not installed (names the extra).
        """
        with _keys_under(config_path):
            return cls._create(cls._block(queues_config, config_path), config_path)

    @classmethod
    def _create(cls, block: QueuesConfig, path: str) -> AnyTransport:
        kind = block.type
        if kind == "in_memory":
            from agentkernel.pipeline.transport.in_memory import InMemoryTransport

            return InMemoryTransport.from_config(block)
        if kind == "sqs":
            require_queue_urls(block, "sqs")
            with require_extra("sqs", f"{path}.type: sqs"):
                from agentkernel.pipeline.transport.sqs import SQSTransport
            return SQSTransport.from_config(block)
        if kind == "nats":
            require_block(block, "nats")
            with require_extra("nats", f"{path}.type: nats"):
                from agentkernel.pipeline.transport.nats import NatsTransport
            return NatsTransport.from_config(block)
        if kind == "kafka":
            require_block(block, "kafka")
            with require_extra("kafka", f"{path}.type: kafka"):
                from agentkernel.pipeline.transport.kafka import KafkaTransport
            return KafkaTransport.from_config(block)
        if kind == "redis":
            require_block(block, "redis")
            with require_extra("redis", "execution.queues.type: redis"):
                from agentkernel.pipeline.transport.redis import RedisStreamsTransport
            return RedisStreamsTransport.from_config(block)
        if kind == "postgres":
            require_block(block, "postgres")
            with require_extra("postgres", f"{path}.type: postgres"):
                from agentkernel.pipeline.transport.postgres import PostgresTransport
            return PostgresTransport.from_config(block)
        if kind in cls._BUILTIN_TYPES or "." not in kind:
            raise AKConfigError(
                f"execution.queues.type: unknown transport '{kind}'; use one of "
                f"{', '.join(cls._BUILTIN_TYPES)} or a dotted path to a QueueTransport subclass"
            )
        transport: QueueTransport = resolve_dotted(kind, QueueTransport, "execution.queues.type")()
        return transport

    @classmethod
    def create_consumer(
        cls,
        queue: QueueName,
        queues_config: QueuesConfigLike | None = None,
        config_path: str = DEFAULT_CONFIG_PATH,
    ) -> TransportConsumer:
        """Shortcut for ``create(queues_config, config_path).create_consumer(queue)``."""
        transport = cls.create(queues_config, config_path)
        with _keys_under(config_path):
            return transport.create_consumer(queue)


@contextmanager
def _keys_under(config_path: str) -> Iterator[None]:
    """Name the keys of a configuration error under ``config_path`` instead of
    ``execution.queues``: the transports name their keys from there, the block may sit
    elsewhere."""
    try:
        yield
    except AKConfigError as exc:
        text = str(exc)
        if config_path == DEFAULT_CONFIG_PATH or DEFAULT_CONFIG_PATH not in text:
            raise
        raise AKConfigError(text.replace(DEFAULT_CONFIG_PATH, config_path)) from exc
