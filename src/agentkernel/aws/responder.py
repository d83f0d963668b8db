"""The serverless response handler: ``ResponseHandler.handle`` (OUTPUT queue -> client).

A reply to a REST turn is written to the DynamoDB response store, where the request handler (or
a poll) finds it. A reply to a WebSocket turn (its messages carry the connection id and the
management endpoint) is pushed to the connection with ``PostToConnection`` as a
``CHAT_RESPONSE`` frame, or as ``STREAM_CHUNK`` frames ending with ``done`` for a streamed turn;
it is stored too when a table is configured, so it can be polled. A connection that is gone
(410) is forgotten and its messages are not retried. A final frame that reached its connection
is the caller reading the reply: its turn no longer counts against the identity's unread quota.

A final reply that names a webhook is POSTed there from background threads while the batch
runs; the invocation then waits for those deliveries (retries included) before it returns, up
to ``api.webhooks.max_delivery_seconds`` and never past the function's own deadline less
:data:`WEBHOOK_MARGIN_SECONDS`: a frozen execution environment sends nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

from agentkernel.aws.lambda_consumer import LambdaSQSConsumer
from agentkernel.aws.settings import ecs_config
from agentkernel.aws.websocket import ConnectionStore
from agentkernel.core.botocore_errors import botocore_errors, client, error_code
from agentkernel.core.config.queues import QueuesConfig
from agentkernel.core.config.root import AKConfig
from agentkernel.core.errors import ResponseStoreError, StoreError, StoreUnavailableError
from agentkernel.pipeline.response_store import ResponseStore, create_response_store
from agentkernel.pipeline.response_store.frames import chunk_frames, done_frame
from agentkernel.pipeline.response_store.handler import ResponseHandler as StoreWriter
from agentkernel.pipeline.response_store.handler import record_of
from agentkernel.pipeline.transport.factory import QueueTransportFactory
from agentkernel.pipeline.webhooks.delivery import WebhookDispatcher
from agentkernel.pipeline.wire.chat import system_response
from agentkernel.pipeline.wire.envelope import (
    ATTR_CHUNK_INDEX,
    ATTR_CLIENT_REQUEST_ID,
    ATTR_CONNECTION_ID,
    ATTR_ENDPOINT,
    ATTR_REQUEST_ID,
    ATTR_STREAM,
    ATTR_USER_ID,
    QueueMessage,
    QueueName,
)

logger = logging.getLogger(__name__)

#: Overrides the management endpoint taken from the event (a local test server, a VPC endpoint).
ENDPOINT_ENV = "AWS_ENDPOINT_URL_APIGATEWAYMANAGEMENTAPI"
#: Seconds of the function's time left unused when waiting for webhooks at the end of a batch.
WEBHOOK_MARGIN_SECONDS = 2.0


class ConnectionGone(Exception):
    """The WebSocket connection no longer exists (API Gateway answered 410)."""


class Pusher:
    """Posts frames to WebSocket connections through the API Gateway management API."""

    def __init__(self) -> None:
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def post(self, endpoint: str, connection_id: str, frame: dict[str, Any]) -> None:
        """Send one frame.

        Raises:
            ConnectionGone: the client disconnected.
            StoreUnavailableError: the management API cannot answer now (retried).
            ResponseStoreError: it refused the call otherwise (retried).
            AKConfigError: no AWS region is configured for the management API client.
        """
        api = self._client(endpoint)
        with self._errors(f"PostToConnection {connection_id}", connection_id):
            api.post_to_connection(ConnectionId=connection_id, Data=json.dumps(frame).encode())

    def close(self, endpoint: str, connection_id: str) -> None:
        """Close a connection (``DeleteConnection``); one already gone is fine.

        Raises:
            StoreUnavailableError, ResponseStoreError, AKConfigError: as :meth:`post`.
        """
        api = self._client(endpoint)
        gone = contextlib.suppress(ConnectionGone)
        with gone, self._errors(f"DeleteConnection {connection_id}", connection_id):
            api.delete_connection(ConnectionId=connection_id)

    @staticmethod
    @contextlib.contextmanager
    def _errors(operation: str, connection_id: str) -> Iterator[None]:
        """The shared botocore rule, plus: a connection API Gateway no longer has is gone."""
        try:
            with botocore_errors(
                operation, unavailable=StoreUnavailableError, failed=ResponseStoreError
            ):
                yield
        except ResponseStoreError as exc:
            if error_code(exc.__cause__) == "GoneException" or _status(exc.__cause__) == 410:
                raise ConnectionGone(connection_id) from exc
            raise

    def _client(self, endpoint: str) -> Any:
        url = os.environ.get(ENDPOINT_ENV) or endpoint
        with self._lock:
            if url not in self._clients:
                self._clients[url] = client(
                    "apigatewaymanagementapi", "the WebSocket management API", endpoint_url=url
                )
            return self._clients[url]


def _status(exc: BaseException | None) -> int | None:
    response = getattr(exc, "response", None)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") if response else None
    return None if status is None else int(status)


class ResponseHandler(LambdaSQSConsumer, StoreWriter):
    """Lambda entry for the OUTPUT queue: store replies, push WebSocket frames."""

    queue = QueueName.OUTPUT
    _instance: ClassVar[ResponseHandler | None] = None

    def __init__(
        self,
        transport: Any,
        store: ResponseStore | None,
        queues: QueuesConfig,
        connections: ConnectionStore | None = None,
        pusher: Pusher | None = None,
        webhooks: WebhookDispatcher | None = None,
    ) -> None:
        StoreWriter.__init__(self, transport, store, queues, webhooks)  # type: ignore[arg-type]
        self.connections = connections
        self.pusher = pusher if pusher is not None else Pusher()

    @classmethod
    def instance(cls) -> ResponseHandler:
        if cls._instance is None:
            config = ecs_config()
            AKConfig.set(config)
            store_config = config.execution.response_store
            store = (
                None if store_config.type == "in_memory" else create_response_store(store_config)
            )
            table = config.api.websocket.connections_table
            handler = cls(
                QueueTransportFactory.create(config.execution.queues),
                store,
                config.execution.queues,
                None
                if table is None
                else ConnectionStore(table, config.api.websocket.connection_ttl),
                webhooks=WebhookDispatcher(config.api.webhooks),
            )
            handler.max_receive_count = config.execution.queues.output.max_receive_count
            cls._instance = handler
        return cls._instance

    @classmethod
    def handle(cls, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        """Lambda entry: returns ``{"batchItemFailures": [...]}``."""
        handler = cls.instance()
        try:
            return handler.handle_batch(event, context)
        finally:
            handler.wait_for_webhooks(context)

    def wait_for_webhooks(self, context: Any = None) -> bool:
        """Wait for the webhooks this container holds, within the function's time left.

        Returns:
            whether none is left (those left resume if the container is invoked again).
        """
        if self.webhooks is None or not self.webhooks.pending():
            return True
        budget = self.webhooks.config.max_delivery_seconds
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        if remaining is not None:
            budget = min(budget, remaining() / 1000 - WEBHOOK_MARGIN_SECONDS)
        done = self.webhooks.drain(max(budget, 0.0))
        if not done:
            logger.warning(
                "returning with %s webhooks unsent: the function's time is running out",
                self.webhooks.pending(),
            )
        return done

    @classmethod
    def reset(cls) -> None:
        cls._instance = None

    def process_message(self, message: QueueMessage) -> None:
        connection = message.attributes.get(ATTR_CONNECTION_ID)
        if self.store is not None and (
            connection is None or ATTR_CHUNK_INDEX not in message.attributes
        ):
            StoreWriter.process_message(self, message)  # stores it, then hands on its webhook
        if connection is not None:
            for frame in self._frames(message):
                if not self._push(message, connection, frame):
                    break
            if self.store is None and ATTR_CHUNK_INDEX not in message.attributes:
                self.notify(message, record_of(message))  # nothing stored: pushed, then posted

    @staticmethod
    def _shown_id(message: QueueMessage) -> str | None:
        """The id the client gave its turn (echoed in frames), else the turn's request id."""
        attributes = message.attributes
        return attributes.get(ATTR_CLIENT_REQUEST_ID) or attributes.get("request_id")

    def on_permanent_failure(self, message: QueueMessage) -> None:
        if self.store is not None:
            StoreWriter.on_permanent_failure(self, message)
        connection = message.attributes.get(ATTR_CONNECTION_ID)
        if connection is not None and ATTR_CHUNK_INDEX not in message.attributes:
            frame = system_response(
                "DELIVERY_FAILED", "the reply could not be delivered", self._shown_id(message)
            )
            self._push(message, connection, frame)

    @classmethod
    def _frames(cls, message: QueueMessage) -> list[dict[str, Any]]:
        """The frames a message becomes: one per chunk it carries, or the reply's one."""
        span = message.attributes.get(ATTR_CHUNK_INDEX)
        if span is None:
            return [cls._frame(message)]
        shown = {"request_id": cls._shown_id(message)}
        chunks = chunk_frames(span, json.loads(message.body))
        if chunks is None:
            logger.error("dropping malformed chunk message %s", message.message_id)
            return []
        return [frame | shown for frame in chunks[1]]

    @classmethod
    def _frame(cls, message: QueueMessage) -> dict[str, Any]:
        shown = {"request_id": cls._shown_id(message)}
        record = record_of(message)
        if ATTR_STREAM in message.attributes:
            return done_frame(record) | shown
        frame = {
            "type": "CHAT_RESPONSE",
            "request_id": shown["request_id"],
            "session_id": record.session_id,
            "status_code": record.status_code,
        }
        return frame | {k: v for k, v in record.body.items() if k not in frame}

    def _push(self, message: QueueMessage, connection: str, frame: dict[str, Any]) -> bool:
        """Post ``frame``; ``False`` when the connection is gone (it is forgotten)."""
        endpoint = message.attributes.get(ATTR_ENDPOINT, "")
        try:
            self.pusher.post(endpoint, connection, frame)
            self._release_quota(message)
        except ConnectionGone:
            logger.info(
                "connection %s is gone; dropping message %s", connection, message.message_id
            )
            if self.connections is not None:
                self.connections.remove(connection)
            return False
        return True

    def _release_quota(self, message: QueueMessage) -> None:
        """A final frame reached its client: release the turn from its owner's unread quota
        (best effort, as the chat front does)."""
        attributes = message.attributes
        owner, request_id = attributes.get(ATTR_USER_ID), attributes.get(ATTR_REQUEST_ID)
        if self.store is None or not owner or not request_id or ATTR_CHUNK_INDEX in attributes:
            return
        try:
            self.store.quota_ledger().read(owner, request_id)
        except StoreError as exc:
            logger.warning("turn %s delivered but still counted as unread: %s", request_id, exc)
