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
   stops; the webhooks still held get up to 2 s to be sent (the rest are counted as dropped),
   the clients this handler created are closed (transport, then response store), and the
   process exits 0.

On the in-memory transport the runner and the response handler consume on the HTTP server's
event loop (:mod:`agentkernel.pipeline.consumer.in_loop`) rather than on consumer threads, so a turn
crosses no thread between the request and its reply.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import cast

import uvicorn

from agentkernel.auth import AuthValidator
from agentkernel.core.agent import AgentRegistry
from agentkernel.core.config.root import AKConfig
from agentkernel.pipeline.consumer.handling import MessageHandling
from agentkernel.pipeline.consumer.in_loop import InLoopConsumer
from agentkernel.pipeline.consumer.loop import ConsumerLoop
from agentkernel.pipeline.http.app import RouterSource
from agentkernel.pipeline.http.listener import accept_new_connections
from agentkernel.pipeline.http.request_handler import RequestHandler
from agentkernel.pipeline.http.server_limits import server_options
from agentkernel.pipeline.process.shutdown import (
    HTTP_DRAIN_SECONDS as HTTP_DRAIN_SECONDS,
)
from agentkernel.pipeline.process.shutdown import (
    LISTENER_DRAIN_SECONDS as LISTENER_DRAIN_SECONDS,
)
from agentkernel.pipeline.process.shutdown import (
    OUTPUT_DRAIN_SECONDS,
    ShutdownOrder,
    shutdown_budget,
)
from agentkernel.pipeline.process.startup import check_backends
from agentkernel.pipeline.response_store import (
    ResponseStore,
    create_response_store,
)
from agentkernel.pipeline.response_store.handler import ResponseHandler
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.runtime import tracing
from agentkernel.pipeline.runtime.collector import tune_for_server
from agentkernel.pipeline.runtime.event_loop import StallWatchdog
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.runtime.thread_runner import ThreadRunner
from agentkernel.pipeline.session_store import create_session_store
from agentkernel.pipeline.transport.blocking import AnyTransport, adapt
from agentkernel.pipeline.transport.factory import QueueTransportFactory
from agentkernel.pipeline.transport.in_memory import InMemoryConsumer
from agentkernel.pipeline.webhooks.delivery import WebhookDispatcher
from agentkernel.pipeline.wire.envelope import QueueName

logger = logging.getLogger(__name__)

#: Replies stored at once by an in-loop response handler (each is a dict write).
OUTPUT_IN_FLIGHT = 256


class IOHandler:
    """Wires the API, the response handler and optionally the Agent Runner in one process.

    Args:
        config: settings.
        registry: the agents.
        with_runner: also run the Agent Runner here (the embedded topology). Default: only when
            the queues live in this process, since nothing outside it can reach them.
        transport: override the configured transport.
        store: override the configured response store.
        auth_validator: check bearer tokens with this validator (authentication on).
        handlers: more routes to serve beside the API's own (see
            :func:`agentkernel.pipeline.http.app.build_app`).
    """

    def __init__(
        self,
        config: AKConfig,
        registry: AgentRegistry,
        *,
        with_runner: bool | None = None,
        transport: AnyTransport | None = None,
        store: ResponseStore | None = None,
        auth_validator: AuthValidator | None = None,
        handlers: Sequence[RouterSource] = (),
    ) -> None:
        self.config = config
        execution = self.config.execution
        self._owned: list[Callable[[], None]] = []  # close() of the clients created here
        if transport is None:
            transport = QueueTransportFactory.create(execution.queues)
            self._owned.append(transport.close)
        if store is None:
            store = create_response_store(execution.response_store)
            self._owned.append(store.close)
        self.transport, self.store = adapt(transport), store
        self._queues = transport  # the in-memory queues themselves, when they are in process
        self.registry = registry
        self.webhooks = WebhookDispatcher(config.api.webhooks)
        self._owned.insert(0, self.webhooks.close)  # before the clients: it sends, they don't
        if with_runner is None:
            with_runner = execution.queues.type == "in_memory"
        self.api = RequestHandler(self.transport, self.store, self.config, self.registry)
        if not with_runner and config.session.type != "in_memory":  # another process's: none
            sessions = create_session_store(config.session)
            self.api.session_ops.sessions = sessions
            self._owned.append(sessions.close)
        #: Queued turns live only in this process: run them before exiting.
        self._local_queue = self.transport.queues_in_process
        self.output_loop = self._output_loop()
        self.runner_loop: ConsumerLoop | InLoopConsumer | None = None
        if with_runner:
            self.runner_loop = self._runner_loop()
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.api.build_app(
                    auth_validator, handlers, with_playground=self._playground(with_runner)
                ),
                host=self.config.api.host,
                port=self.config.api.port,
                log_config=None,
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=5,
                # asyncio's loop, even where uvloop is installed (uvicorn's "auto" would pick it):
                # uvloop's loop refused to close at shutdown (EBUSY), which failed the HTTP
                # thread and so exited the process 1, and it saved no CPU per turn here.
                loop="asyncio",
                **server_options(self.config.api),
            )
        )
        self._stopped = threading.Event()
        self._sockets: list[socket.socket] | None = None
        self._http_done = threading.Event()
        METRICS.add_collector(self._sample_depth)

    def _playground(self, with_runner: bool) -> bool:
        """``api.playground``, or when unset: on where this process runs the agents."""
        setting = self.config.api.playground
        return with_runner if setting is None else setting

    def _output_loop(self) -> ConsumerLoop | InLoopConsumer:
        """Stopped by the shutdown sequence, after the runner, not by the shutdown itself."""
        queues = self.config.execution.queues
        handler = ResponseHandler(self.transport, self.store, queues, self.webhooks)
        if self._local_queue and self.store.nonblocking:
            handling = handler.handling(on_event_loop=True)
            return self._in_loop(handling, QueueName.OUTPUT, OUTPUT_IN_FLIGHT, OUTPUT_DRAIN_SECONDS)
        return handler.consumer_loop(stop=threading.Event(), drain_timeout=OUTPUT_DRAIN_SECONDS)

    def _runner_loop(self) -> ConsumerLoop | InLoopConsumer:
        runner = AgentRunner(self.config, self.registry, transport=self.transport)
        self._owned.append(runner.sessions.close)
        self.api.stores["session_store"] = runner.sessions  # /ready checks it too
        self.api.session_ops.sessions = runner.sessions  # the sessions API reads the same
        if not self._local_queue:
            return runner.consumer_loop()  # a broker keeps the queued turns: stop at shutdown
        if isinstance(self.output_loop, InLoopConsumer):  # both on this loop: no OUTPUT hop
            runner.replies.hand_over = self.output_loop.hand_over
        settings = self.config.execution.runner
        limit = settings.in_flight_limit(queues_in_process=True)
        return self._in_loop(runner.handling(), QueueName.INPUT, limit, settings.drain_timeout)

    def _in_loop(
        self, handling: MessageHandling, queue: QueueName, max_in_flight: int, drain_timeout: float
    ) -> InLoopConsumer:
        queues = self._queues  # in this process: an in-memory consumer
        return InLoopConsumer(
            handling,
            lambda: cast(InMemoryConsumer, queues.create_consumer(queue)),
            max_in_flight=max_in_flight,
            drain_timeout=drain_timeout,
            name=str(queue),
        )

    @classmethod
    def run(
        cls,
        auth_validator: AuthValidator | None = None,
        handlers: Sequence[RouterSource] | None = None,
        *,
        with_runner: bool | None = None,
    ) -> None:
        """Process entry: build from the process's configuration and agents, serve until SIGTERM.

        The CLI sets both (:meth:`AKConfig.set`, the registry the agents registered in).
        ``auth_validator`` and ``handlers`` are upstream's parameters, in its order.
        """
        handler = cls(
            AKConfig.get(),
            AgentRegistry.default(),
            with_runner=with_runner,
            auth_validator=auth_validator,
            handlers=handlers or (),
        )
        handler.check_startup()
        ThreadRunner.install_signal_handlers()
        handler.serve()

    def check_startup(self) -> None:
        """Fail before serving when a queue or store of this process is missing or unreachable.

        Raises:
            AKConfigError: a queue or table does not exist.
            TransportError, StoreError: the broker or a store cannot be reached.
        """
        check_backends(self.transport, (QueueName.INPUT, QueueName.OUTPUT), self.api.stores)

    def serve(
        self, exit_on_shutdown: bool = True, sockets: list[socket.socket] | None = None
    ) -> None:
        """Run every part until shutdown; blocks.

        Args:
            exit_on_shutdown: exit the process once the shutdown order has run; the process is
                then this server's, and its garbage collector is tuned for serving
                (:mod:`agentkernel.pipeline.runtime.collector`).
            sockets: listen on these already bound sockets instead of ``api.host:api.port``
                (``serve --reload``, whose parent process binds the port once).
        """
        tracing.export_if_configured()
        self._sockets = sockets
        for sock in sockets or ():
            accept_new_connections(sock)  # the process before this one stopped taking them
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
        if exit_on_shutdown:  # the process is this server's: tune its collector
            tune_for_server()
        ThreadRunner.run(
            tasks, exit_on_shutdown=exit_on_shutdown, shutdown_timeout=self.shutdown_budget
        )
        self.server.should_exit = True

    @property
    def shutdown_budget(self) -> float:
        """Longest time from SIGTERM to exit, in seconds: the sum of every step's bound."""
        return shutdown_budget(self.config, self.runner_loop is not None)

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
        await self.server.serve(sockets=self._sockets)

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
        """Wait for the shutdown (or :meth:`stop`), then run the shutdown order."""
        while not (ThreadRunner.shutdown_event.is_set() or self._stopped.is_set()):
            self._stopped.wait(0.2)
        ShutdownOrder(
            config=self.config,
            api=self.api,
            server=self.server,
            transport=self.transport,
            store=self.store,
            output_loop=self.output_loop,
            runner_loop=self.runner_loop,
            owned=self._owned,
            http_done=self._http_done,
            webhooks=self.webhooks,
        ).run()

    def _sample_depth(self) -> None:
        depth = getattr(self.transport, "depth", None)
        if depth is not None:
            for queue in QueueName:
                METRICS.set("agentkernel_queue_depth", depth(queue), queue=str(queue))
