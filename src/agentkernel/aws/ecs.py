"""The containerized (ECS) queue mode: an IO container and Agent Runner containers on SQS.

Both containers are configured only by environment variables (see docs/deploy-containerized.md):
the queue URLs make the transport SQS and the DynamoDB table name makes the response store
DynamoDB, so ``execution.queues.type`` and ``execution.response_store.type`` need not be set.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

from agentkernel.auth import AuthValidator
from agentkernel.aws import sqs_records
from agentkernel.aws.settings import container_api, ecs_config
from agentkernel.core import logs
from agentkernel.core.agent import AgentRegistry
from agentkernel.core.config.root import AKConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.core.redact import redact_url
from agentkernel.pipeline.consumer.base import QueueConsumer
from agentkernel.pipeline.http.app import RouterSource
from agentkernel.pipeline.http.request_handler import RequestHandler
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.pipeline.process.startup import check_backends, one_line_exit
from agentkernel.pipeline.response_store import create_response_store
from agentkernel.pipeline.response_store.handler import ResponseHandler
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.runtime import tracing
from agentkernel.pipeline.runtime.collector import tune_for_server
from agentkernel.pipeline.runtime.thread_runner import ThreadRunner
from agentkernel.pipeline.transport.factory import QueueTransportFactory
from agentkernel.pipeline.webhooks.delivery import WebhookDispatcher
from agentkernel.pipeline.wire.envelope import QueueName

logger = logging.getLogger(__name__)


class ECSSQSConsumer(QueueConsumer):
    """Base of the ECS consumers: ``run()`` polls one SQS queue on ``num_consumers`` threads.

    A subclass written to the queue-mode guide gives ``get_queue_url``, ``process_message`` and
    ``on_permanent_failure`` as class methods over raw boto3 records (and may override ``poll``,
    ``delete_message``, ``max_receive_count``, ``num_consumers``); ``run()`` drives them on the
    pipeline's consumer loop. ``poll`` is one long-poll receive of up to
    ``execution.queues.batch_size`` records; a record received more than ``max_receive_count``
    times goes to ``on_permanent_failure`` and is then deleted; one whose processing raises is
    left for the visibility timeout to deliver again.

    :class:`ECSAgentRunner` and :class:`ECSOutputConsumer` are the pipeline's own subclasses:
    they take envelopes and are configured by ``AK_...`` variables.
    """

    queue: ClassVar[QueueName]
    #: Polling threads of :meth:`run` (the pipeline's own subclasses read their queue's
    #: ``no_of_consumers`` instead).
    num_consumers: int = 10

    @classmethod
    def get_queue_url(cls) -> str:
        """The URL of the SQS queue to poll; a guide-shaped subclass overrides it.

        Raises:
            AKConfigError: no URL is configured for this class's queue.
        """
        queue = getattr(cls, "queue", None)
        url = getattr(ecs_config().execution.queues, queue.value).url if queue else None
        if not url:
            raise AKConfigError(
                f"{cls.__name__}.get_queue_url(): no queue URL; override it to return the URL "
                "of the SQS queue to poll"
            )
        return str(url)

    @classmethod
    def _get_client(cls) -> Any:
        """The process's boto3 SQS client (upstream's name, for ``poll`` overrides)."""
        return sqs_records.sqs()

    @classmethod
    def poll(cls) -> list[dict[str, Any]]:
        """One long-poll receive (``execution.queues.sqs.wait_time_seconds``, 20 s by default):
        up to ``execution.queues.batch_size`` raw boto3 records, with their system and message
        attributes."""
        return sqs_records.receive(cls.get_queue_url())

    @classmethod
    def delete_message(cls, record: dict[str, Any]) -> None:
        """Delete a handled record (a raw boto3 record from :meth:`poll`)."""
        sqs_records.delete(cls.get_queue_url(), record)

    @classmethod
    def poll_batch_size(cls) -> int:
        return sqs_records.batch_size()

    @classmethod
    def run(cls) -> None:
        """Container entry: poll until SIGTERM, finish the records in hand, exit 0 (1 after a
        thread crashed).

        Raises:
            AKConfigError: no queue URL.
            ValueError: ``num_consumers`` or ``max_receive_count`` below 1.
        """
        logs.configure_unless_configured(AKConfig.get().logging)
        cls.check_settings()
        url = cls.get_queue_url()
        if not url:
            raise AKConfigError(f"{cls.__name__}.get_queue_url() returned no queue URL")
        logger.info("%s polling %s on %s threads", cls.__name__, redact_url(url), cls.num_consumers)
        super().run()


class _FromEnvironment(ECSSQSConsumer):
    """The pipeline's ECS consumers: built from ``AK_...`` variables, fed envelopes."""

    @classmethod
    def from_environment(cls) -> _FromEnvironment:
        """Build from ``AK_...`` variables (and ``config.yaml`` when present)."""
        raise NotImplementedError

    @classmethod
    def run(cls) -> None:
        """Container entry: consume until SIGTERM, drain, exit 0 (exit 1 after a crash)."""
        logs.configure_unless_configured(ecs_config().logging)
        with one_line_exit():
            consumer = cls.from_environment()
        tracing.export_if_configured()
        ThreadRunner.install_signal_handlers()
        consumer.consumer_loop().run()  # type: ignore[attr-defined]


class ECSAgentRunner(_FromEnvironment, AgentRunner):
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
        with one_line_exit():
            runner = cls.from_environment()
            check_backends(runner.transport, (QueueName.INPUT,), {"session_store": runner.sessions})
        ThreadRunner.install_signal_handlers()
        tune_for_server()  # the container is the runner's
        runner.serve()


class ECSOutputConsumer(_FromEnvironment, ResponseHandler):
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
            WebhookDispatcher(config.api.webhooks),
        )


class ECSQueueRequestHandler(RequestHandler):
    """The IO container's REST API: ``POST /api/v1/chat`` enqueues, ``GET`` polls."""


class ECSIOHandler(IOHandler):
    """The IO container: REST API thread plus OUTPUT consumer threads, no agents.

    It listens on every interface (``0.0.0.0``) unless ``api.host`` is set: a container is
    reached through its network interface, never its loopback. The playground page is off
    unless ``api.playground`` turns it on, whether or not agents run here.
    """

    def _playground(self, with_runner: bool) -> bool:
        return bool(self.config.api.playground)

    @classmethod
    def run(
        cls,
        auth_validator: AuthValidator | None = None,
        handlers: Sequence[RouterSource] | None = None,
        *,
        with_runner: bool | None = False,
    ) -> None:
        """Container entry: serve until SIGTERM, drain the OUTPUT consumers, exit 0.

        Args:
            auth_validator: checks bearer tokens on every route but ``/health`` and ``/ready``
                (authentication on, API keys of ``api.auth.api_keys`` still accepted).
            handlers: more routes served beside the API's own: upstream ``RESTRequestHandler``
                objects (anything with ``get_router()``) or FastAPI routers.
            with_runner: also run agents in this container (not the guide's topology).

        Raises:
            AKConfigError: the response store is not shared, or a handler has no router.
        """
        config = container_api(ecs_config())
        logs.configure_unless_configured(config.logging)
        with one_line_exit():
            if not create_response_store(config.execution.response_store).shared:
                raise AKConfigError(
                    "execution.response_store.dynamodb.table_name: the IO container needs a "
                    "shared response store (set AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME)"
                )
            AKConfig.set(config)
            handler = cls(
                config,
                AgentRegistry.default(),
                with_runner=with_runner,
                auth_validator=auth_validator,
                handlers=handlers or (),
            )
            handler.check_startup()
        ThreadRunner.install_signal_handlers()
        handler.serve()
