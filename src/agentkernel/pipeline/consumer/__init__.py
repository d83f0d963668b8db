"""Consuming a queue: the fetch loop and what every message goes through on its way.

Names are imported lazily so that importing one piece does not load the loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentkernel.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from agentkernel.pipeline.consumer.base import QueueConsumer
    from agentkernel.pipeline.consumer.loop import ConsumerLoop

__all__ = ["ConsumerLoop", "QueueConsumer"]

_LAZY = {
    "ConsumerLoop": "agentkernel.pipeline.consumer.loop",
    "QueueConsumer": "agentkernel.pipeline.consumer.base",
}

__getattr__ = lazy_getattr("agentkernel.pipeline.consumer", _LAZY)
