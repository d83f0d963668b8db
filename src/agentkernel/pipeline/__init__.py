"""The queue pipeline: envelope, transports, consumer loop, thread runner and components.

Names are imported lazily so that ``import agentkernel.pipeline`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentkernel.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from agentkernel.pipeline.consumer.base import QueueConsumer
    from agentkernel.pipeline.consumer.loop import ConsumerLoop
    from agentkernel.pipeline.envelope import QueueMessage, QueueName
    from agentkernel.pipeline.process.thread_runner import ThreadRunner

__all__ = ["ConsumerLoop", "QueueConsumer", "QueueMessage", "QueueName", "ThreadRunner"]

_LAZY = {
    "ConsumerLoop": "agentkernel.pipeline.consumer.loop",
    "QueueConsumer": "agentkernel.pipeline.consumer.base",
    "QueueMessage": "agentkernel.pipeline.envelope",
    "QueueName": "agentkernel.pipeline.envelope",
    "ThreadRunner": "agentkernel.pipeline.process.thread_runner",
}


__getattr__ = lazy_getattr("agentkernel.pipeline", _LAZY)
