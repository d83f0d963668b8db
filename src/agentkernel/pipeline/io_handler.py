"""The IO process: REST API thread plus OUTPUT consumer threads, and, when embedded, the runner.

Shutdown (SIGTERM/SIGINT) is ordered so nothing in hand is lost: new chat requests are refused
with 503, the Agent Runner finishes its in-flight turns, the response handler drains the replies
they produced, the HTTP server finishes the responses it is writing (at most
``HTTP_DRAIN_SECONDS``), and the process exits 0.
"""

from __future__ import annotations

import logging
import threading
import time

import uvicorn

from agentkernel.core.agent import AgentRegistry
from agentkernel.core.config import AKConfig
from agentkernel.pipeline.agent_runner import AgentRunner
from agentkernel.pipeline.consumer import ConsumerLoop
from agentkernel.pipeline.envelope import QueueName
from agentkernel.pipeline.metrics import METRICS
from agentkernel.pipeline.request_handler import RequestHandler
from agentkernel.pipeline.response_handler import ResponseHandler
from agentkernel.pipeline.response_store import ResponseStore, create_response_store
from agentkernel.pipeline.thread_runner import ThreadRunner
from agentkernel.pipeline.transport.base import QueueTransport, QueueTransportFactory

logger = logging.getLogger(__name__)

OUTPUT_DRAIN_SECONDS = 2.0
HTTP_DRAIN_SECONDS = 5.0


class IOHandler:
    """Wires the API, the response handler and optionally the Agent Runner in one process.

    Args:
        config: settings; default the process-wide :class:`AKConfig`.
        with_runner: also run the Agent Runner here (the embedded topology). Default: only when
            the transport is ``in_memory``, since nothing outside the process can reach it.
        registry: the agents; default the process-wide registry.
        transport: override the configured transport.
        store: override the configured response store.
    """

    def __init__(
        self,
        config: AKConfig | None = None,
        *,
        with_runner: bool | None = None,
        registry: AgentRegistry | None = None,
        transport: QueueTransport | None = None,
        store: ResponseStore | None = None,
    ) -> None:
        self.config = config if config is not None else AKConfig.get()
        execution = self.config.execution
        self.transport = (
            transport if transport is not None else QueueTransportFactory.create(execution.queues)
        )
        self.store = store if store is not None else create_response_store(execution.response_store)
        self.registry = registry if registry is not None else AgentRegistry.default()
        if with_runner is None:
            with_runner = execution.queues.type == "in_memory"
        self.api = RequestHandler(self.transport, self.store, self.config, self.registry)
        self.output_loop = ResponseHandler(
            self.transport, self.store, execution.queues
        ).consumer_loop(exit_on_shutdown=False, stop_on_shutdown=False)
        self.runner_loop: ConsumerLoop | None = None
        if with_runner:
            runner = AgentRunner(
                self.transport,
                registry=self.registry,
                queues=execution.queues,
                runner=execution.runner,
            )
            self.runner_loop = runner.consumer_loop(exit_on_shutdown=False)
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.api.build_app(),
                host=self.config.api.host,
                port=self.config.api.port,
                log_config=None,
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=5,
            )
        )
        self._stopped = threading.Event()
        METRICS.add_collector(self._sample_depth)

    @classmethod
    def run(cls, with_runner: bool | None = None) -> None:
        """Process entry: build from configuration and serve until SIGTERM, then exit."""
        handler = cls(with_runner=with_runner)
        ThreadRunner.install_signal_handlers()
        handler.serve()

    def serve(self, exit_on_shutdown: bool = True) -> None:
        """Run every part until shutdown; blocks."""
        if self.runner_loop is not None and not self.registry.agents():
            logger.warning("the embedded runner has no agents; every turn will be answered 404")
        tasks = [
            ThreadRunner.Task(
                self.server.run, "rest-api", stop_all_on_failure=True, awaited_on_shutdown=False
            ),
            ThreadRunner.Task(self._sequence_shutdown, "shutdown-sequencer"),
            *self.output_loop.tasks(),
        ]
        if self.runner_loop is not None:
            tasks += self.runner_loop.tasks()
        ThreadRunner.run(tasks, exit_on_shutdown=exit_on_shutdown)
        self.server.should_exit = True

    def stop(self) -> None:
        """Stop this handler without touching the process-wide shutdown state (tests)."""
        self._stopped.set()

    def wait_started(self, timeout: float = 10.0) -> int:
        """Wait until the HTTP server listens; returns its port."""
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("the HTTP server did not start")
            time.sleep(0.01)
        return int(self.server.servers[0].sockets[0].getsockname()[1])

    def _sequence_shutdown(self) -> None:
        """On shutdown: runner first, then the replies it produced, then the API."""
        while not (ThreadRunner.shutdown_event.is_set() or self._stopped.is_set()):
            self._stopped.wait(0.2)
        if self.runner_loop is not None:
            self.runner_loop.stop()
            self.runner_loop.wait_stopped()
        self._drain_output()
        self.output_loop.stop()
        self.output_loop.wait_stopped()
        self._drain_http()
        self.server.should_exit = True

    def _drain_http(self) -> None:
        """Let requests still being answered (replies just stored) reach their clients."""
        deadline = time.monotonic() + HTTP_DRAIN_SECONDS
        while self.server.server_state.tasks and time.monotonic() < deadline:
            time.sleep(0.02)

    def _drain_output(self) -> None:
        depth = getattr(self.transport, "depth", None)
        deadline = time.monotonic() + OUTPUT_DRAIN_SECONDS
        while depth is not None and depth(QueueName.OUTPUT) and time.monotonic() < deadline:
            time.sleep(0.02)

    def _sample_depth(self) -> None:
        depth = getattr(self.transport, "depth", None)
        if depth is not None:
            for queue in QueueName:
                METRICS.set("agentkernel_queue_depth", depth(queue), queue=str(queue))
