"""The queue pipeline: envelope, transports, consumer loop, thread runner and components.

Names are imported lazily so that ``import agentkernel.pipeline`` stays cheap (importing the
package never imports FastAPI, a broker client or a store client). The components are exported
under the names upstream agentkernel's ``agentkernel.pipeline`` gives them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentkernel.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from agentkernel.pipeline.consumer.base import QueueConsumer
    from agentkernel.pipeline.consumer.loop import ConsumerLoop
    from agentkernel.pipeline.http.request_handler import RequestHandler
    from agentkernel.pipeline.process.io_handler import IOHandler
    from agentkernel.pipeline.response_store.handler import ResponseHandler
    from agentkernel.pipeline.runner.agent_runner import AgentRunner
    from agentkernel.pipeline.runtime.thread_runner import ThreadRunner
    from agentkernel.pipeline.transport.base import QueueTransport, TransportConsumer
    from agentkernel.pipeline.transport.factory import QueueTransportFactory
    from agentkernel.pipeline.transport.in_memory import InMemoryTransport
    from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

__all__ = [
    "AgentRunner",
    "ConsumerLoop",
    "IOHandler",
    "InMemoryTransport",
    "QueueConsumer",
    "QueueMessage",
    "QueueName",
    "QueueTransport",
    "QueueTransportFactory",
    "RequestHandler",
    "ResponseHandler",
    "ThreadRunner",
    "TransportConsumer",
]

_LAZY = {
    "AgentRunner": "agentkernel.pipeline.runner.agent_runner",
    "ConsumerLoop": "agentkernel.pipeline.consumer.loop",
    "IOHandler": "agentkernel.pipeline.process.io_handler",
    "InMemoryTransport": "agentkernel.pipeline.transport.in_memory",
    "QueueConsumer": "agentkernel.pipeline.consumer.base",
    "QueueMessage": "agentkernel.pipeline.wire.envelope",
    "QueueName": "agentkernel.pipeline.wire.envelope",
    "QueueTransport": "agentkernel.pipeline.transport.base",
    "QueueTransportFactory": "agentkernel.pipeline.transport.factory",
    "RequestHandler": "agentkernel.pipeline.http.request_handler",
    "ResponseHandler": "agentkernel.pipeline.response_store.handler",
    "ThreadRunner": "agentkernel.pipeline.runtime.thread_runner",
    "TransportConsumer": "agentkernel.pipeline.transport.base",
}


__getattr__ = lazy_getattr("agentkernel.pipeline", _LAZY)
