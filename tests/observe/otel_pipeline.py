"""One turn through the embedded pipeline with the OpenTelemetry SDK's in-memory exporter; prints
the finished spans as JSON. Run as its own process: a tracer provider is set once per process."""

import json
import sys
import threading

import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentkernel import Agent, AgentRegistry, RetryableError
from agentkernel.core.config.root import AKConfig
from agentkernel.pipeline.process.io_handler import IOHandler

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)


async def echo(turn):
    with trace.get_tracer("agent").start_as_current_span("model call"):
        return turn.prompt


async def flaky(turn):
    if turn.attempt == 1:
        raise RetryableError("overloaded")
    return "second time"


registry = AgentRegistry()
registry.register(Agent("echo", echo))
registry.register(Agent("flaky", flaky))
config = AKConfig.load()
config = config.model_copy(update={"api": config.api.model_copy(update={"port": 0})})
handler = IOHandler(config, registry)
server = threading.Thread(target=handler.serve, kwargs={"exit_on_shutdown": False})
server.start()
url = f"http://127.0.0.1:{handler.wait_started()}/api/v1/chat"
replies = []
for agent in sys.argv[2:]:
    body = {"session_id": "traced", "prompt": "hi", "agent": agent}
    replies.append(httpx.post(url, json=body, headers={"traceparent": sys.argv[1]}, timeout=30))
handler.stop()
server.join(15)
spans = [
    {
        "name": s.name,
        "kind": s.kind.name,
        "trace_id": format(s.context.trace_id, "032x"),
        "span_id": format(s.context.span_id, "016x"),
        "parent": format(s.parent.span_id, "016x") if s.parent else None,
        "status": s.status.status_code.name,
        "attributes": dict(s.attributes or {}),
    }
    for s in exporter.get_finished_spans()
]
print(json.dumps({"replies": [r.json() for r in replies], "spans": spans}))
