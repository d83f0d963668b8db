"""The IO process's shutdown order, written once (see :mod:`.io_handler` for the steps).

Every step is bounded; :func:`shutdown_budget` is the sum of the bounds, the longest time from
SIGTERM to exit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import uvicorn

from agentkernel.core.config.queues import SQSQueueConfig
from agentkernel.core.config.root import AKConfig
from agentkernel.pipeline.consumer.in_loop import InLoopConsumer
from agentkernel.pipeline.consumer.loop import ConsumerLoop
from agentkernel.pipeline.http.listener import accept_backlog, refuse_new_connections
from agentkernel.pipeline.http.request_handler import RequestHandler
from agentkernel.pipeline.response_store import ResponseStore
from agentkernel.pipeline.runtime.thread_runner import close_in_order
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.redelivery import STOP_CHECK_SECONDS
from agentkernel.pipeline.webhooks.delivery import DRAIN_SECONDS as WEBHOOK_DRAIN_SECONDS
from agentkernel.pipeline.webhooks.delivery import WebhookDispatcher
from agentkernel.pipeline.wire.envelope import ATTR_REQUEST_ID, QueueMessage, QueueName
from agentkernel.pipeline.wire.records import ResponseRecord
from agentkernel.pipeline.wire.replies import error_doc, webhook_of

logger = logging.getLogger(__name__)

OUTPUT_DRAIN_SECONDS = 2.0
HTTP_DRAIN_SECONDS = 5.0
#: Longest wait for the connections the kernel queued before new ones were refused, in seconds.
LISTENER_DRAIN_SECONDS = 1.0
#: Time for the requests of the connections accepted last to arrive, in seconds.
LAST_REQUEST_SECONDS = 0.2
#: Margin for each bounded step beyond its own budget (thread joins, the last poll).
STEP_MARGIN_SECONDS = 2.0

Loop = ConsumerLoop | InLoopConsumer


class ProcessQueues(Protocol):
    """What a transport whose queues live in this process (``queues_in_process``) offers."""

    def depth(self, queue: QueueName) -> int: ...

    def in_flight(self, queue: QueueName) -> int: ...

    def purge(self, queue: QueueName) -> list[QueueMessage]: ...


def shutdown_budget(config: AKConfig, with_runner: bool) -> float:
    """Longest time from SIGTERM to exit, in seconds: the sum of every step's bound."""
    runner = config.execution.runner.drain_timeout if with_runner else 0.0
    steps = [runner, OUTPUT_DRAIN_SECONDS, config.api.shutdown_timeout, fetch_wait(config)]
    steps += [OUTPUT_DRAIN_SECONDS, HTTP_DRAIN_SECONDS, LISTENER_DRAIN_SECONDS]
    steps += [HTTP_DRAIN_SECONDS, WEBHOOK_DRAIN_SECONDS]
    return sum(steps) + len(steps) * STEP_MARGIN_SECONDS


@dataclass
class ShutdownOrder:
    """The parts of an IO process, stopped in order by :meth:`run`.

    Args:
        owned: ``close`` callables of the clients the process created, closed last.
        http_done: set once the HTTP server's thread has ended.
        webhooks: where the answer of a turn abandoned at shutdown is POSTed, when it names a
            webhook.
    """

    config: AKConfig
    api: RequestHandler
    server: uvicorn.Server
    transport: QueueTransport
    store: ResponseStore
    output_loop: Loop
    runner_loop: Loop | None
    owned: list[Callable[[], None]]
    http_done: threading.Event
    webhooks: WebhookDispatcher | None = None

    def run(self) -> None:
        """Runner first, then the replies it produced, then the API, then the clients."""
        logger.info("shutting down: draining turns and replies")
        if self.runner_loop is not None:
            self._drain_runner(self.runner_loop)
        self._drain_local(QueueName.OUTPUT, OUTPUT_DRAIN_SECONDS)
        wait_until(lambda: not self.api.waiting(), self.config.api.shutdown_timeout)
        if self.api.waiting():
            logger.warning(
                "answering %s waiting requests 503 with their request id", self.api.waiting()
            )
        self.api.release_waiters()
        self.output_loop.stop()
        # a consumer in an SQS long poll ends it first: up to 20 s with nothing in hand
        if not self.output_loop.wait_stopped(self.output_loop.stop_seconds + STEP_MARGIN_SECONDS):
            logger.error("the response handler did not stop in time")
        wait_until(lambda: not self.server.server_state.tasks, HTTP_DRAIN_SECONDS)
        self._stop_accepting()
        self.server.should_exit = True
        if not self.http_done.wait(HTTP_DRAIN_SECONDS + STEP_MARGIN_SECONDS):
            logger.error("the HTTP server did not stop in time")
        close_in_order(self.owned)

    def _stop_accepting(self) -> None:
        """Refuse new connections, then answer those the kernel had queued before that.

        uvicorn closes its listening socket on exit, which resets every connection still
        queued there (its request sent, never answered), and closes the connections whose
        request it has not read yet.
        """
        listeners = [sock for server in self.server.servers for sock in server.sockets]
        if not all([refuse_new_connections(sock) for sock in listeners]):
            return
        wait_until(
            lambda: not any(accept_backlog(sock) for sock in listeners), LISTENER_DRAIN_SECONDS
        )
        time.sleep(LAST_REQUEST_SECONDS)
        wait_until(lambda: not self.server.server_state.tasks, HTTP_DRAIN_SECONDS)

    def _drain_runner(self, loop: Loop) -> None:
        """Stop the embedded runner within ``execution.runner.drain_timeout``.

        When the queues live in this process the queued turns die with it, so they are run
        first; a turn that cannot run in time is logged and its caller answered 503.
        """
        budget = self.config.execution.runner.drain_timeout
        began = time.monotonic()
        self._drain_local(QueueName.INPUT, budget)
        loop.stop(drain_timeout=max(began + budget - time.monotonic(), 0.0), since=began)
        if not loop.wait_stopped(budget + STEP_MARGIN_SECONDS):
            logger.error("the embedded runner did not stop in time")
        queues = self._process_queues()
        if queues is not None:
            for message in queues.purge(QueueName.INPUT):
                self._abandon(message, started=message.message_id in loop.handling.handed_back)

    def _process_queues(self) -> ProcessQueues | None:
        if not self.transport.queues_in_process:
            return None
        queues: ProcessQueues = self.transport  # type: ignore[assignment]
        return queues

    def _drain_local(self, queue: QueueName, seconds: float) -> None:
        """Wait up to ``seconds`` until an in-process queue has nothing queued or in flight."""
        queues = self._process_queues()
        if queues is not None:
            wait_until(lambda: not (queues.depth(queue) or queues.in_flight(queue)), seconds)

    def _abandon(self, message: QueueMessage, started: bool) -> None:
        """A turn the embedded runner could not finish before exit: log it, answer its caller.

        Args:
            started: the turn was running when the drain ended (rather than still queued).
        """
        request_id = message.attributes.get(ATTR_REQUEST_ID, "")
        session_id = message.group_id or ""
        logger.error(
            "turn %s of session %s was %s before shutdown (delivery %s); it is lost",
            request_id or message.message_id,
            session_id,
            "cut short: it did not finish" if started else "not run",
            message.receive_count,
        )
        if not request_id:
            return
        text = (
            "the server stopped while this turn was running, before it finished; send it again"
            if started
            else "the server stopped before this turn could run; send it again"
        )
        doc = error_doc("SHUTTING_DOWN", text, session_id, request_id)
        record = ResponseRecord(request_id, session_id, 503, doc)
        try:
            self.store.put(record)
        except Exception:
            logger.warning("could not store the 503 of request %s", request_id, exc_info=True)
            return
        if self.webhooks is not None and (url := webhook_of(message)) is not None:
            self.webhooks.submit(url, record)  # sent while the clients close, within its drain


def fetch_wait(config: AKConfig) -> float:
    """Longest a stopped consumer thread may still sit in one fetch, in seconds."""
    queues = config.execution.queues
    if queues.type == "sqs":
        return (queues.sqs or SQSQueueConfig()).wait_time_seconds
    return STOP_CHECK_SECONDS


def wait_until(done: Callable[[], bool], seconds: float) -> bool:
    """Poll ``done`` until it is true or ``seconds`` have passed; returns its last value."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True
