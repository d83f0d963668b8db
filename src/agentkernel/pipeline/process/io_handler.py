"""The IO process: REST API thread plus OUTPUT consumer threads, and, when embedded, the runner.

Shutdown (SIGTERM/SIGINT) is ordered so nothing in hand is lost and every wait is bounded:

1. new chat requests are refused with 503 ``SHUTTING_DOWN``;
2. an embedded runner on the in-memory transport runs the turns already accepted, queued ones
   included, for up to ``execution.runner.drain_timeout`` seconds (nothing outlives the process:
   a turn that could not run is logged by request id and its caller answered 503); a runner on a
   broker finishes its turns in flight and leaves the queued ones to the broker;
3. the response handler keeps storing replies while ``rest_sync`` requests still wait, for up to
   ``api.shutdown_timeout`` seconds; the requests still waiting then are answered 503 with their
   ``request_id`` and a ``Location`` to poll, never a dropped connection;
4. the response handler stops, the HTTP server finishes the responses it is writing (at most
   ``HTTP_DRAIN_SECONDS``), takes no new connection (on Linux a connection request then meets
   a closed port when the client sends it again and is refused; one the kernel had already
   queued is still answered, not reset: see :mod:`agentkernel.pipeline.http.listener`) and
   stops; the clients this handler created are closed (transport, then response store), and the
   process exits 0.

On the in-memory transport the runner and the response handler consume on the HTTP server's
event loop (:mod:`agentkernel.pipeline.consumer.in_loop`) rather than on consumer threads, so a turn
crosses no thread between the request and its reply.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

import uvicorn

from agentkernel.core.agent import AgentRegistry
from agentkernel.core.config import AKConfig
from agentkernel.pipeline.agent_runner import AgentRunner
from agentkernel.pipeline.consumer.handling import MessageHandling
from agentkernel.pipeline.consumer.in_loop import InLoopConsumer
from agentkernel.pipeline.consumer.loop import ConsumerLoop
from agentkernel.pipeline.envelope import ATTR_REQUEST_ID, QueueMessage, QueueName
from agentkernel.pipeline.http.listener import accept_backlog, refuse_new_connections
from agentkernel.pipeline.process.event_loop import StallWatchdog
from agentkernel.pipeline.process.metrics import METRICS
from agentkernel.pipeline.process.thread_runner import ThreadRunner, close_in_order
from agentkernel.pipeline.replies import error_doc
from agentkernel.pipeline.request_handler import RequestHandler
from agentkernel.pipeline.response_handler import ResponseHandler
from agentkernel.pipeline.response_store import (
    ResponseRecord,
    ResponseStore,
    create_response_store,
)
from agentkernel.pipeline.transport.base import QueueTransport, QueueTransportFactory
from agentkernel.pipeline.transport.in_memory import InMemoryTransport

logger = logging.getLogger(__name__)

OUTPUT_DRAIN_SECONDS = 2.0
#: Replies stored at once by an in-loop response handler (each is a dict write).
OUTPUT_IN_FLIGHT = 256
HTTP_DRAIN_SECONDS = 5.0
#: Longest wait for the connections the kernel queued before new ones were refused, in seconds.
LISTENER_DRAIN_SECONDS = 1.0
#: Time for the requests of the connections accepted last to arrive, in seconds.
LAST_REQUEST_SECONDS = 0.2
#: Margin for each bounded step beyond its own budget (thread joins, the last poll).
_STEP_MARGIN_SECONDS = 2.0


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
        self._owned: list[Callable[[], None]] = []  # close() of the clients created here
        if transport is None:
            transport = QueueTransportFactory.create(execution.queues)
            self._owned.append(transport.close)
        if store is None:
            store = create_response_store(execution.response_store)
            self._owned.append(store.close)
        self.transport, self.store = transport, store
        self.registry = registry if registry is not None else AgentRegistry.default()
        if with_runner is None:
            with_runner = execution.queues.type == "in_memory"
        self.api = RequestHandler(self.transport, self.store, self.config, self.registry)
        #: Queued turns live only in this process: run them before exiting.
        self._local_queue = isinstance(self.transport, InMemoryTransport)
        self.output_loop = self._output_loop()
        self.runner_loop: ConsumerLoop | InLoopConsumer | None = None
        if with_runner:
            self.runner_loop = self._runner_loop()
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
        self._http_done = threading.Event()
        METRICS.add_collector(self._sample_depth)

    def _output_loop(self) -> ConsumerLoop | InLoopConsumer:
        """Stopped by the shutdown sequence, after the runner, not by the shutdown itself."""
        handler = ResponseHandler(self.transport, self.store, self.config.execution.queues)
        if self._local_queue and self.store.nonblocking:
            handling = handler.handling(on_event_loop=True)
            return self._in_loop(handling, QueueName.OUTPUT, OUTPUT_IN_FLIGHT, OUTPUT_DRAIN_SECONDS)
        return handler.consumer_loop(stop=threading.Event(), drain_timeout=OUTPUT_DRAIN_SECONDS)

    def _runner_loop(self) -> ConsumerLoop | InLoopConsumer:
        execution = self.config.execution
        runner = AgentRunner(
            self.transport,
            registry=self.registry,
            queues=execution.queues,
            runner=execution.runner,
        )
        if not self._local_queue:
            return runner.consumer_loop()  # a broker keeps the queued turns: stop at shutdown
        settings = execution.runner
        return self._in_loop(
            runner.handling(), QueueName.INPUT, settings.max_in_flight, settings.drain_timeout
        )

    def _in_loop(
        self, handling: MessageHandling, queue: QueueName, max_in_flight: int, drain_timeout: float
    ) -> InLoopConsumer:
        transport = self.transport
        assert isinstance(transport, InMemoryTransport)
        return InLoopConsumer(
            handling,
            lambda: transport.create_consumer(queue),
            max_in_flight=max_in_flight,
            drain_timeout=drain_timeout,
            name=str(queue),
        )

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
                self._serve_http, "rest-api", stop_all_on_failure=True, awaited_on_shutdown=False
            ),
            ThreadRunner.Task(self._sequence_shutdown, "shutdown-sequencer"),
        ]
        for loop in (self.output_loop, self.runner_loop):
            if isinstance(loop, ConsumerLoop):
                tasks += loop.tasks()
        ThreadRunner.run(
            tasks, exit_on_shutdown=exit_on_shutdown, shutdown_timeout=self.shutdown_budget
        )
        self.server.should_exit = True

    @property
    def shutdown_budget(self) -> float:
        """Longest time from SIGTERM to exit, in seconds: the sum of every step's bound."""
        runner = self.config.execution.runner.drain_timeout if self.runner_loop else 0.0
        steps = [runner, OUTPUT_DRAIN_SECONDS, self.config.api.shutdown_timeout]
        steps += [OUTPUT_DRAIN_SECONDS, HTTP_DRAIN_SECONDS, LISTENER_DRAIN_SECONDS]
        steps += [HTTP_DRAIN_SECONDS]
        return sum(steps) + len(steps) * _STEP_MARGIN_SECONDS

    def _serve_http(self) -> None:
        try:
            config = self.server.config
            get_factory = getattr(config, "get_loop_factory", None)  # absent on older uvicorn
            if get_factory is None:
                config.setup_event_loop()
            with asyncio.Runner(loop_factory=get_factory() if get_factory else None) as runner:
                runner.run(self._serve_async())
        finally:
            self._http_done.set()

    async def _serve_async(self) -> None:
        """The HTTP server, with the consumers that run on its event loop."""
        for loop in (self.output_loop, self.runner_loop):
            if isinstance(loop, InLoopConsumer):
                loop.start()
        stall_warning = self.config.execution.runner.stall_warning
        if isinstance(self.runner_loop, InLoopConsumer) and stall_warning is not None:
            StallWatchdog(
                asyncio.get_running_loop(), threading.current_thread(), stall_warning
            ).start()
        await self.server.serve()

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
        """On shutdown: runner first, then the replies it produced, then the API, then clients."""
        while not (ThreadRunner.shutdown_event.is_set() or self._stopped.is_set()):
            self._stopped.wait(0.2)
        logger.info("shutting down: draining turns and replies")
        if self.runner_loop is not None:
            self._drain_runner(self.runner_loop)
        self._drain_local(QueueName.OUTPUT, OUTPUT_DRAIN_SECONDS)
        _wait_until(lambda: not self.api.waiting(), self.config.api.shutdown_timeout)
        if self.api.waiting():
            logger.warning(
                "answering %s waiting requests 503 with their request id", self.api.waiting()
            )
        self.api.release_waiters()
        self.output_loop.stop()
        if not self.output_loop.wait_stopped(OUTPUT_DRAIN_SECONDS + _STEP_MARGIN_SECONDS):
            logger.error("the response handler did not stop in time")
        _wait_until(lambda: not self.server.server_state.tasks, HTTP_DRAIN_SECONDS)
        self._stop_accepting()
        self.server.should_exit = True
        if not self._http_done.wait(HTTP_DRAIN_SECONDS + _STEP_MARGIN_SECONDS):
            logger.error("the HTTP server did not stop in time")
        close_in_order(self._owned)

    def _stop_accepting(self) -> None:
        """Refuse new connections, then answer those the kernel had queued before that.

        uvicorn closes its listening socket on exit, which resets every connection still
        queued there (its request sent, never answered), and closes the connections whose
        request it has not read yet.
        """
        listeners = [sock for server in self.server.servers for sock in server.sockets]
        if not all([refuse_new_connections(sock) for sock in listeners]):
            return
        _wait_until(
            lambda: not any(accept_backlog(sock) for sock in listeners), LISTENER_DRAIN_SECONDS
        )
        time.sleep(LAST_REQUEST_SECONDS)
        _wait_until(lambda: not self.server.server_state.tasks, HTTP_DRAIN_SECONDS)

    def _drain_runner(self, loop: ConsumerLoop | InLoopConsumer) -> None:
        """Stop the embedded runner within ``execution.runner.drain_timeout``.

        On the in-memory transport the queued turns die with the process, so they are run
        first; a turn that cannot run in time is logged and its caller answered 503.
        """
        budget = self.config.execution.runner.drain_timeout
        deadline = time.monotonic() + budget
        if self._local_queue:
            self._drain_local(QueueName.INPUT, budget)
        loop.stop(drain_timeout=max(deadline - time.monotonic(), 0.0))
        if not loop.wait_stopped(budget + _STEP_MARGIN_SECONDS):
            logger.error("the embedded runner did not stop in time")
        if isinstance(self.transport, InMemoryTransport):
            for message in self.transport.purge(QueueName.INPUT):
                self._abandon(message)

    def _drain_local(self, queue: QueueName, seconds: float) -> None:
        """Wait up to ``seconds`` until an in-memory queue has nothing queued or in flight."""
        if isinstance(self.transport, InMemoryTransport):
            transport = self.transport
            _wait_until(lambda: not (transport.depth(queue) or transport.in_flight(queue)), seconds)

    def _abandon(self, message: QueueMessage) -> None:
        """A turn the embedded runner could not run before exit: log it, answer its caller."""
        request_id = message.attributes.get(ATTR_REQUEST_ID, "")
        session_id = message.group_id or ""
        logger.error(
            "turn %s of session %s was not run before shutdown (delivery %s); it is lost",
            request_id or message.message_id,
            session_id,
            message.receive_count,
        )
        if not request_id:
            return
        text = "the server stopped before this turn could run; send it again"
        doc = error_doc("SHUTTING_DOWN", text, session_id, request_id)
        try:
            self.store.put(ResponseRecord(request_id, session_id, 503, doc))
        except Exception:
            logger.warning("could not store the 503 of request %s", request_id, exc_info=True)

    def _sample_depth(self) -> None:
        depth = getattr(self.transport, "depth", None)
        if depth is not None:
            for queue in QueueName:
                METRICS.set("agentkernel_queue_depth", depth(queue), queue=str(queue))


def _wait_until(done: Callable[[], bool], seconds: float) -> bool:
    """Poll ``done`` until it is true or ``seconds`` have passed; returns its last value."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True
