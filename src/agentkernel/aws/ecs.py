"""The containerized (ECS) queue mode: an IO container and Agent Runner containers on SQS.

Both containers are configured only by environment variables (see docs/deploy-containerized.md):
the queue URLs make the transport SQS and the DynamoDB table name makes the response store
DynamoDB, so ``execution.queues.type`` and ``execution.response_store.type`` need not be set.
"""

from __future__ import annotations

from typing import ClassVar

from agentkernel.aws.settings import ecs_config
from agentkernel.core import logs
from agentkernel.core.agent import AgentRegistry
from agentkernel.core.config import AKConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.pipeline import tracing
from agentkernel.pipeline.agent_runner import AgentRunner
from agentkernel.pipeline.consumer.base import QueueConsumer
from agentkernel.pipeline.envelope import QueueMessage, QueueName
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.pipeline.process.thread_runner import ThreadRunner
from agentkernel.pipeline.request_handler import RequestHandler
from agentkernel.pipeline.response_handler import ResponseHandler
from agentkernel.pipeline.response_store import create_response_store
from agentkernel.pipeline.transport.base import (
    QueueTransport,
    QueueTransportFactory,
    TransportConsumer,
)


class ECSSQSConsumer(QueueConsumer):
    """Base of the ECS consumers: ``run()`` starts ``no_of_consumers`` long-poll threads.

    ``poll``/``delete_message`` work on a consumer of their own, for code that drives the queue
    by hand; the threads started by ``run`` each have their own.
    """

    queue: ClassVar[QueueName]
    transport: QueueTransport
    _poller: TransportConsumer | None = None

    def poll(self, batch_size: int = 1, wait_seconds: float = 20.0) -> list[QueueMessage]:
        if self._poller is None:
            self._poller = self.transport.create_consumer(self.queue)
        return self._poller.fetch(batch_size, wait_seconds)

    def delete_message(self, message: QueueMessage) -> None:
        if self._poller is None:
            raise RuntimeError("delete_message() of a message that poll() did not return")
        self._poller.ack(message)

    @classmethod
    def from_environment(cls) -> ECSSQSConsumer:
        """Build from ``AK_...`` variables (and ``config.yaml`` when present)."""
        raise NotImplementedError

    @classmethod
    def run(cls) -> None:
        """Container entry: consume until SIGTERM, drain, exit 0 (exit 1 after a crash)."""
        logs.configure_unless_configured(ecs_config().logging)
        consumer = cls.from_environment()
        tracing.export_if_configured()
        ThreadRunner.install_signal_handlers()
        consumer.consumer_loop().run()  # type: ignore[attr-defined]


class ECSAgentRunner(ECSSQSConsumer, AgentRunner):
    """The Agent Runner container: INPUT -> agents -> OUTPUT on SQS."""

    queue = QueueName.INPUT

    @classmethod
    def from_environment(cls) -> ECSAgentRunner:
        config = ecs_config()
        AKConfig.set(config)
        return cls(config, AgentRegistry.default())

    @classmethod
    def run(cls) -> None:
        """Container entry: consume until SIGTERM, drain, exit 0 (exit 1 after a crash); with
        ``execution.runner.health_port`` set, serve health, readiness and metrics on it."""
        logs.configure_unless_configured(ecs_config().logging)
        runner = cls.from_environment()
        ThreadRunner.install_signal_handlers()
        runner.serve()


class ECSOutputConsumer(ECSSQSConsumer, ResponseHandler):
    """The IO container's OUTPUT consumer threads: replies -> response store."""

    queue = QueueName.OUTPUT

    @classmethod
    def from_environment(cls) -> ECSOutputConsumer:
        config = ecs_config()
        transport = QueueTransportFactory.create(config.execution.queues)
        return cls(
            transport,
            create_response_store(config.execution.response_store),
            config.execution.queues,
        )


class ECSQueueRequestHandler(RequestHandler):
    """The IO container's REST API: ``POST /api/v1/chat`` enqueues, ``GET`` polls."""


class ECSIOHandler(IOHandler):
    """The IO container: REST API thread plus OUTPUT consumer threads, no agents."""

    @classmethod
    def run(cls, with_runner: bool | None = False) -> None:
        """Container entry: serve until SIGTERM, drain the OUTPUT consumers, exit 0."""
        config = ecs_config()
        logs.configure_unless_configured(config.logging)
        if not create_response_store(config.execution.response_store).shared:
            raise AKConfigError(
                "execution.response_store.dynamodb.table_name: the IO container needs a shared "
                "response store (set AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME)"
            )
        AKConfig.set(config)
        handler = cls(config, AgentRegistry.default(), with_runner=with_runner)
        ThreadRunner.install_signal_handlers()
        handler.serve()
