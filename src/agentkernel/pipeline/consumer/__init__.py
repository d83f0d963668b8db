"""Consuming a queue: the fetch loop and what every message goes through on its way.

Names are imported lazily so that importing one piece does not load the loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentkernel.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from agentkernel.pipeline.consumer.base import QueueConsumer
    from agentkernel.pipeline.consumer.handling import HandlingPolicy, MessageHandling
    from agentkernel.pipeline.consumer.loop import ConsumerLoop
    from agentkernel.pipeline.consumer.settings import LoopSettings

__all__ = ["ConsumerLoop", "HandlingPolicy", "LoopSettings", "MessageHandling", "QueueConsumer"]

_LAZY = {
    "ConsumerLoop": "agentkernel.pipeline.consumer.loop",
    "LoopSettings": "agentkernel.pipeline.consumer.settings",
    "HandlingPolicy": "agentkernel.pipeline.consumer.handling",
    "MessageHandling": "agentkernel.pipeline.consumer.handling",
    "QueueConsumer": "agentkernel.pipeline.consumer.base",
}

__getattr__ = lazy_getattr("agentkernel.pipeline.consumer", _LAZY)
