"""The serverless Agent Runner: ``ServerlessAgentRunner.handle`` and the streaming variant.

One-line entry files, as in the queue-mode guide::

    from agentkernel.aws import ServerlessAgentRunner
    import my_agents  # registers the agents
    handler = ServerlessAgentRunner.handle

Configured like the ECS runner, by the guide's ``AK_...`` variables (queue URLs, table names,
``max_receive_count``); the INPUT queue is the event source.
"""

from __future__ import annotations

from typing import Any, ClassVar

from agentkernel.aws.lambda_consumer import LambdaSQSConsumer
from agentkernel.aws.settings import ecs_config
from agentkernel.core.agent import AgentRegistry
from agentkernel.core.config.root import AKConfig
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.wire.envelope import QueueName


class ServerlessAgentRunner(LambdaSQSConsumer, AgentRunner):
    """Runs the turns of an SQS batch and sends their replies to OUTPUT."""

    queue = QueueName.INPUT
    _instances: ClassVar[dict[type, ServerlessAgentRunner]] = {}

    @classmethod
    def instance(cls) -> ServerlessAgentRunner:
        """The runner of this Lambda container (built on the first invocation, then reused)."""
        runner = cls._instances.get(cls)
        if runner is None:
            config = ecs_config()
            AKConfig.set(config)
            runner = cls(config, AgentRegistry.default())
            runner.max_receive_count = config.execution.queues.input.max_receive_count
            cls._instances[cls] = runner
        return runner

    @classmethod
    def handle(cls, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        """Lambda entry: returns ``{"batchItemFailures": [...]}``."""
        return cls.instance().handle_batch(event, context)

    @classmethod
    def reset(cls) -> None:
        """Forget the built runners (tests)."""
        cls._instances.clear()


class ServerlessStreamAgentRunner(ServerlessAgentRunner):
    """The same, but every reply is streamed: its chunks on OUTPUT (those yielded while a send
    was on its way together in one message), then the reply."""

    stream_all = True
