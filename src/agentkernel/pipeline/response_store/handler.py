"""The response handler: OUTPUT queue -> response store.

Each OUTPUT message becomes a :class:`ResponseRecord` keyed by its ``request_id`` attribute, with
the status from the ``status_code`` attribute; one with a ``chunk_index`` attribute carries one
chunk of a streamed reply, or several consecutive ones
(:mod:`agentkernel.pipeline.response_store.frames`), kept beside it for streaming clients in one
store write. While the store is down, messages are delivered again with a growing delay (the
consumer loop's back-off); a message that exhausted its deliveries is still stored as the reply it
carries, so an outage longer than the retries only delays replies. A message that cannot be decoded
(a body that is not a JSON object, or one the transport could not decode at all) is answered with an
error record when its request id is known, so a waiting caller is never left hanging.

A final reply whose message names a webhook (``ATTR_WEBHOOK``) is handed, once stored, to the
:class:`~agentkernel.pipeline.webhooks.delivery.WebhookDispatcher`, which POSTs it in the
background; stream chunks never are.
"""

from __future__ import annotations

import functools
import json
import logging
import threading

from agentkernel.core.blocking import nonblocking_async
from agentkernel.core.config.queues import QueuesConfig
from agentkernel.core.errors import StoreError
from agentkernel.pipeline.consumer.base import QueueConsumer
from agentkernel.pipeline.consumer.handler import as_async
from agentkernel.pipeline.consumer.handling import HandlingPolicy, MessageHandling
from agentkernel.pipeline.consumer.loop import ConsumerLoop
from agentkernel.pipeline.consumer.settings import DRAIN_TIMEOUT_SECONDS, LoopSettings
from agentkernel.pipeline.response_store import ResponseStore
from agentkernel.pipeline.response_store.frames import chunk_frames
from agentkernel.pipeline.transport.blocking import AnyTransport, adapt
from agentkernel.pipeline.webhooks.delivery import WebhookDispatcher
from agentkernel.pipeline.wire.envelope import (
    ATTR_CHUNK_INDEX,
    ATTR_REQUEST_ID,
    ATTR_STATUS_CODE,
    ATTR_USER_ID,
    ATTR_WEBHOOK,
    QueueMessage,
    QueueName,
)
from agentkernel.pipeline.wire.records import ResponseRecord

logger = logging.getLogger(__name__)

#: Messages per OUTPUT fetch when ``execution.queues.batch_size`` is unset. Replies and chunks
#: are small and stored at once; fetched one at a time, a few streams outran the IO process.
OUTPUT_BATCH_SIZE = 10


def record_of(message: QueueMessage) -> ResponseRecord:
    """Decode an OUTPUT message into the record to store.

    Raises:
        ValueError: the message has no request id or its body is not a JSON object.
    """
    request_id = message.attributes.get(ATTR_REQUEST_ID)
    if not request_id:
        raise ValueError(f"OUTPUT message {message.message_id} has no request_id attribute")
    body = json.loads(message.body)
    if not isinstance(body, dict):
        raise ValueError(f"OUTPUT message {message.message_id} body is not a JSON object")
    try:
        status = int(message.attributes.get(ATTR_STATUS_CODE, "200"))
    except ValueError:
        status = 200
    session_id = str(body.get("session_id") or message.group_id or "")
    return ResponseRecord(
        request_id, session_id, status, body, message.attributes.get(ATTR_USER_ID)
    )


class ResponseHandler(QueueConsumer):
    """Consumes OUTPUT and writes each reply to the response store.

    Args:
        transport: carries the OUTPUT queue.
        store: where replies are written.
        queues: the ``execution.queues`` settings (OUTPUT's receive limit and back-off).
        webhooks: posts final replies to the webhooks they name (``None``: none are posted).
    """

    def __init__(
        self,
        transport: AnyTransport,
        store: ResponseStore,
        queues: QueuesConfig,
        webhooks: WebhookDispatcher | None = None,
    ) -> None:
        self.transport = adapt(transport)
        self.store = store
        self.queues = queues
        self.webhooks = webhooks

    def handling(self, on_event_loop: bool = False) -> MessageHandling:
        """What each OUTPUT message goes through.

        Args:
            on_event_loop: store each reply on the handling's event loop instead of a worker
                thread (an in-process store, which never blocks).
        """
        # Async either way, so that the consumer loop keeps many replies in flight: handled one
        # per place of a fetched batch, a stream of small chunk messages waited on each store
        # round trip in turn (the order of a session's messages is kept by the handling).
        wrap = nonblocking_async if on_event_loop else as_async
        process, failure = wrap(self.process_message), wrap(self.on_permanent_failure)
        undecodable = wrap(self.on_undecodable)
        policy = HandlingPolicy(max_receive_count=self.queues.output.max_receive_count)
        return MessageHandling(
            process,
            failure,
            queue=QueueName.OUTPUT,
            policy=policy,
            on_undecodable=undecodable,
            process_now=self.process_message if on_event_loop else None,
        )

    def consumer_loop(
        self, stop: threading.Event | None = None, drain_timeout: float = DRAIN_TIMEOUT_SECONDS
    ) -> ConsumerLoop:
        """The :class:`ConsumerLoop` that drives this handler on consumer threads.

        Args:
            stop: stops the loop once set; default the process's shutdown event.
            drain_timeout: seconds a stopping consumer thread waits for its messages in hand.
        """
        settings = LoopSettings(
            num_consumers=self.queues.output.no_of_consumers,
            batch_size=self.queues.batch_size or OUTPUT_BATCH_SIZE,
            drain_timeout=drain_timeout,
        )
        factory = functools.partial(self.transport.create_consumer, QueueName.OUTPUT)
        return ConsumerLoop(self.handling(), factory, settings, stop)

    def process_message(self, message: QueueMessage) -> None:
        index = message.attributes.get(ATTR_CHUNK_INDEX)
        if index is not None:
            self._put_chunk(message, index)
            return
        try:
            record = record_of(message)
        except ValueError:  # retrying cannot make it readable: answer the caller now
            self.on_permanent_failure(message)
            return
        self.store.put(record)
        self.notify(message, record)
        self._count(record.owner, record.request_id, len(message.body))

    def _put_chunk(self, message: QueueMessage, span: str) -> None:
        try:
            chunks = chunk_frames(span, json.loads(message.body))
        except ValueError:
            chunks = None
        if chunks is None:
            logger.error("dropping malformed chunk message %s", message.message_id)
            return
        request_id = message.attributes.get(ATTR_REQUEST_ID, "")
        first, frames = chunks
        try:
            self.store.put_chunks(request_id, first, frames)
            owner = message.attributes.get(ATTR_USER_ID)
            self._count(owner, f"{request_id}#{first}", len(message.body))
        except NotImplementedError:
            # The final reply still arrives; only live chunks are lost to this store.
            logger.warning("%s keeps no stream chunks; dropping one", type(self.store).__name__)

    def _count(self, owner: str | None, key: str, size: int) -> None:
        """Count stored bytes against the owner's quota; best effort (the reply is stored)."""
        if owner is None:
            return
        try:
            self.store.quota_ledger().stored(owner, key, size)
        except StoreError as exc:
            logger.warning("stored bytes of %s not counted for its owner: %s", key, exc)

    def on_permanent_failure(self, message: QueueMessage) -> None:
        """Store the reply anyway (the store may be back), or an error record if it is unreadable.

        Raises:
            ResponseStoreError: the store is still down; the message stays queued.
        """
        request_id = message.attributes.get(ATTR_REQUEST_ID)
        if not request_id:
            logger.error("dropping OUTPUT message %s: no request_id", message.message_id)
            return
        if ATTR_CHUNK_INDEX in message.attributes:
            # A lost chunk must not end the stream: the turn's final reply is still to come.
            logger.error("dropping chunk message %s of %s", message.message_id, request_id)
            return
        try:
            record = record_of(message)
        except ValueError:
            logger.error(
                "OUTPUT message %s of request %s is unreadable", message.message_id, request_id
            )
        else:
            self.store.put(record)
            self.notify(message, record)
            return
        self._put_error(message, request_id)

    def on_undecodable(self, message: QueueMessage) -> None:
        """Store an error record for a message the transport could not decode, if it names a
        request (not a chunk: the turn's final reply is still to come)."""
        request_id = message.attributes.get(ATTR_REQUEST_ID)
        if request_id and ATTR_CHUNK_INDEX not in message.attributes:
            self._put_error(message, request_id)

    def _put_error(self, message: QueueMessage, request_id: str) -> None:
        session_id = message.group_id or ""
        doc = {
            "error": "DELIVERY_FAILED",
            "message": "the reply could not be delivered",
            "session_id": session_id,
            "request_id": request_id,
        }
        record = ResponseRecord(request_id, session_id, 500, doc)
        self.store.put(record)
        self.notify(message, record)

    def notify(self, message: QueueMessage, record: ResponseRecord) -> None:
        """Hand a stored final reply to its webhook, if it names one; returns at once."""
        url = message.attributes.get(ATTR_WEBHOOK)
        if url and self.webhooks is not None and ATTR_CHUNK_INDEX not in message.attributes:
            self.webhooks.submit(url, record)
