"""Queue transports: one broker per module, all behind :mod:`.base`.

The contract and the in-memory transport are also importable from here, as upstream code does
(``from agentkernel.pipeline.transport import QueueTransport``); imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentkernel.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from agentkernel.pipeline.transport.base import QueueTransport, TransportConsumer
    from agentkernel.pipeline.transport.factory import QueueTransportFactory
    from agentkernel.pipeline.transport.in_memory import InMemoryTransport

__all__ = ["InMemoryTransport", "QueueTransport", "QueueTransportFactory", "TransportConsumer"]

_LAZY = {
    "InMemoryTransport": "agentkernel.pipeline.transport.in_memory",
    "QueueTransport": "agentkernel.pipeline.transport.base",
    "QueueTransportFactory": "agentkernel.pipeline.transport.factory",
    "TransportConsumer": "agentkernel.pipeline.transport.base",
}

__getattr__ = lazy_getattr("agentkernel.pipeline.transport", _LAZY)
