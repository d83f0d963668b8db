"""The serverless request handler: ``Lambda.handler`` behind API Gateway.

An adapter over the chat front (:class:`~agentkernel.pipeline.front.chat_front.ChatFront`), the same
one the containerized API serves: routes, statuses, error codes and bodies are those of
docs/http-api.md, read from HTTP API (payload 2.0) and REST API (1.0) proxy events. A ``rest_sync``
POST waits for its reply until the function's remaining time or API Gateway's 29 seconds would run
out, then answers 504 with the ``request_id``. The caller's identity is the one API Gateway's
authorizer established (see :func:`~agentkernel.aws.events.authorized_identity`), mapped through
``api.auth.aliases``, and a reply is shown to that identity only. WebSocket ``$default``/``chat``
messages are enqueued with the connection as the reply address and answered ``CHAT_QUEUED``, echoing
the client's ``request_id``. With ``api.websocket.connections_table`` set, a message's identity is
the one the connection handler stored at ``$connect``, and a connection whose record is gone (its
credential expired, or its TTL ended) is answered ``SYSTEM_RESPONSE`` ``CREDENTIAL_EXPIRED`` and
closed::

    from agentkernel.aws import Lambda

    @Lambda.register("/app", method="GET")
    def app_info(event, context):
        return {"version": "1"}

    handler = Lambda.handler
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from agentkernel.auth import alias
from agentkernel.aws.container_loop import run_in_container
from agentkernel.aws.events import (
    BadEvent,
    HttpRequest,
    SocketMessage,
    http_response,
    parse_api_event,
)
from agentkernel.aws.routes import (
    Route,
    cancel_route,
    chat_alias,
    custom_response,
    is_read,
    normalize,
    read_address,
    sessions_route,
    under_base,
)
from agentkernel.aws.settings import ecs_config
from agentkernel.core.config.root import AKConfig
from agentkernel.pipeline.front.chat_front import (
    CHAT_PATH,
    Answer,
    ChatCall,
    ChatFront,
    StreamAnswer,
)
from agentkernel.pipeline.front.turn_control import cancel_frame
from agentkernel.pipeline.response_store import create_response_store
from agentkernel.pipeline.session_store import create_session_store
from agentkernel.pipeline.transport.factory import QueueTransportFactory
from agentkernel.pipeline.wire.chat import (
    CancelFrame,
    FrameError,
    HTTPError,
    parse_frame,
    system_response,
)
from agentkernel.pipeline.wire.envelope import (
    ATTR_CLIENT_REQUEST_ID,
    ATTR_CONNECTION_ID,
    ATTR_ENDPOINT,
    ATTR_STREAM,
)

if TYPE_CHECKING:  # boto3 is imported only where a connections table is used
    from agentkernel.aws.websocket import ConnectionStore

logger = logging.getLogger(__name__)

API_GATEWAY_LIMIT_SECONDS = 29.0
#: Time kept back from the function's remaining time to answer 504 before it ends.
ANSWER_MARGIN_SECONDS = 1.0
T = TypeVar("T")


class Lambda:
    """The request handler function (class-level, as users' entry files expect)."""

    _routes: ClassVar[dict[tuple[str, str], Route]] = {}
    _front: ClassVar[ChatFront | None] = None
    _connections: ClassVar[ConnectionStore | None] = None

    @classmethod
    def register(cls, route: str, method: str | None = "GET") -> Callable[[Route], Route]:
        """Add a custom route, served at ``route`` and under the API base path (``/app`` at
        ``/api/v1/app`` too); ``fn(event, context)`` returns what
        :func:`~agentkernel.aws.routes.custom_response` reads (a document is answered as JSON
        200). ``method`` defaults to ``GET``.
        """
        key = ((method or "GET").upper(), normalize(route))

        def decorate(fn: Route) -> Route:
            cls._routes[key] = fn
            return fn

        return decorate

    @classmethod
    def reset(cls) -> None:
        """Forget custom routes and built clients (tests)."""
        cls._routes, cls._front, cls._connections = {}, None, None

    @classmethod
    def use_front(cls, front: ChatFront) -> None:
        """Serve ``front`` instead of one built from the environment (tests, embedding)."""
        cls._front = front

    @classmethod
    def front(cls) -> ChatFront:
        """The chat front of this Lambda container, built once from its configuration."""
        if cls._front is None:
            config = ecs_config()
            AKConfig.set(config)
            transport = QueueTransportFactory.create(config.execution.queues)
            store = create_response_store(config.execution.response_store)
            session = config.session  # in memory, sessions live in the runner function only
            sessions = None if session.type == "in_memory" else create_session_store(session)
            cls._front = ChatFront(transport, store, config, sessions=sessions)
        return cls._front

    @classmethod
    def handler(cls, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        """Lambda entry for API Gateway proxy events (HTTP, REST and WebSocket APIs)."""
        try:
            request = parse_api_event(event)
            if isinstance(request, SocketMessage):
                return cls._socket(request)
            return cls._http(request, event, context)
        except BadEvent as exc:
            return http_response(400, {"error": "BAD_EVENT", "message": str(exc)})
        except HTTPError as exc:
            return _answer(Answer.of(exc))
        except Exception:
            logger.exception("unexpected failure of the request handler")
            return http_response(500, {"error": "INTERNAL_ERROR", "message": "unexpected error"})

    @classmethod
    def _run(cls, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on this container's event loop, kept across warm invocations."""
        return run_in_container(work)

    # -- HTTP ------------------------------------------------------------------------------

    @classmethod
    def _http(cls, request: HttpRequest, event: dict[str, Any], context: Any) -> dict[str, Any]:
        custom = cls._routes.get((request.method, request.path))
        if custom is not None:
            return custom_response(custom(event, context))
        if request.method == "GET" and request.path == "/health":
            return http_response(200, {"status": "ok"})
        if request.method == "GET" and request.path == "/api/v1/agents":
            return _answer(cls.front().agents())
        path = chat_alias(request.path)
        if request.method == "POST" and path == CHAT_PATH:
            front = cls.front()
            identity = alias(front.config.api.auth.aliases, request.identity)
            return _answer(cls._run(front.post_chat(_chat_call(request, identity, context))))
        if is_read(request, path):
            return cls._read(request, path)
        if (session_id := cancel_route(request, path)) is not None:
            front = cls.front()
            identity = alias(front.config.api.auth.aliases, request.identity)
            request_id = request.query.get("request_id")
            return _answer(cls._run(front.cancel(session_id, request_id, identity)))
        if (route := sessions_route(request)) is not None:
            return cls._sessions(request, *route)
        under = under_base(request.path)
        custom = None if under is None else cls._routes.get((request.method, under))
        if custom is not None:
            return custom_response(custom(event, context))
        raise HTTPError(404, "NOT_FOUND", f"no route {request.method} {request.path}")

    @classmethod
    def _read(cls, request: HttpRequest, path: str) -> dict[str, Any]:
        """A reply read, in any of its forms."""
        front = cls.front()
        address = read_address(request, path, front.config.api.max_body_bytes)
        identity = alias(front.config.api.auth.aliases, request.identity)
        return _answer(cls._run(front.get_chat(*address, identity)))

    @classmethod
    def _sessions(cls, request: HttpRequest, method: str, session_id: str | None) -> dict[str, Any]:
        """The sessions API: list (``session_id`` ``None``), show or erase one session."""
        front = cls.front()
        identity = alias(front.config.api.auth.aliases, request.identity)
        if session_id is None:
            query = request.query
            work = front.list_sessions(identity, query.get("limit"), query.get("cursor"))
        elif method == "GET":
            work = front.show_session(session_id, identity)
        else:
            work = front.delete_session(session_id, identity)
        return _answer(cls._run(work))

    # -- WebSocket -------------------------------------------------------------------------

    @classmethod
    def _socket(cls, message: SocketMessage) -> dict[str, Any]:
        if message.event_type != "MESSAGE":
            return {"statusCode": 200}
        front = cls.front()
        client_id = None
        try:
            identity = cls._socket_identity(front, message)
            text = message.body.decode("utf-8", "replace")
            client_id, chat = parse_frame(text, front.config.api.max_body_bytes)
            if isinstance(chat, CancelFrame):
                return cls._cancel(front, chat, client_id, identity)
            chat = front.check_chat(chat)
            attributes = {
                ATTR_CONNECTION_ID: message.connection_id,
                ATTR_ENDPOINT: message.endpoint,
            }
            if chat.stream:
                attributes[ATTR_STREAM] = "1"
            if client_id is not None:
                attributes[ATTR_CLIENT_REQUEST_ID] = client_id
            request_id = cls._run(front.socket_request_id(client_id, identity))
            enqueue = front.enqueue(
                chat,
                request_id,
                message.headers.get("traceparent", ""),
                identity=identity,
                attributes=attributes,
            )
            cls._run(enqueue)
        except FrameError as exc:
            shown = exc.request_id or client_id
            frame = system_response(exc.code, str(exc), shown, exc.details)
            return {"statusCode": 200, "body": json.dumps(frame)}
        except HTTPError as exc:
            frame = system_response(exc.doc["error"], exc.doc["message"], client_id)
            return {"statusCode": 200, "body": json.dumps(frame)}
        shown = client_id or request_id
        queued = {"type": "CHAT_QUEUED", "request_id": shown, "session_id": chat.session_id}
        return {"statusCode": 200, "body": json.dumps(queued)}

    @classmethod
    def _cancel(
        cls, front: ChatFront, cancel: CancelFrame, client_id: str | None, identity: str | None
    ) -> dict[str, Any]:
        """A cancel frame: the ``CANCEL_RESPONSE`` is the route's answer; the turn's own frame
        is pushed to the connection by the responder when it ends."""
        request_id = cls._run(front.socket_request_id(client_id, identity))
        answer = cls._run(front.cancel(cancel.session_id, request_id, identity))
        frame = cancel_frame(answer, client_id or request_id, cancel.session_id)
        return {"statusCode": 200, "body": json.dumps(frame)}

    @classmethod
    def _socket_identity(cls, front: ChatFront, message: SocketMessage) -> str | None:
        """Who sends this message: the identity the connection handler stored at ``$connect``
        when a connections table is configured, else the authorizer's.

        Raises:
            FrameError: ``CREDENTIAL_EXPIRED`` for a connection without a live record (its
                credential expired): the connection is closed as well.
        """
        api = front.config.api
        table = api.websocket.connections_table
        if not table:
            return alias(api.auth.aliases, message.identity)
        from agentkernel.aws.responder import Pusher
        from agentkernel.aws.websocket import ConnectionStore

        if cls._connections is None:
            cls._connections = ConnectionStore(table, api.websocket.connection_ttl)
        record = cls._connections.get(message.connection_id)
        if record is None:
            logger.info("closing connection %s: its credential expired", message.connection_id)
            Pusher().close(message.endpoint, message.connection_id)
            raise FrameError(
                "CREDENTIAL_EXPIRED",
                "the credential of this connection expired; reconnect with a fresh one",
            )
        return alias(api.auth.aliases, record.get("user_id") or message.identity)


def _chat_call(request: HttpRequest, identity: str | None, context: Any) -> ChatCall:
    headers = request.headers
    return ChatCall(
        body=request.body,
        identity=identity,
        idempotency_key=headers.get("idempotency-key"),
        prefer=headers.get("prefer", ""),
        traceparent=headers.get("traceparent", ""),
        budget=_budget(context),
    )


def _answer(answer: Answer | StreamAnswer) -> dict[str, Any]:
    if isinstance(answer, StreamAnswer):  # never asked for: this adapter reads no Accept
        raise HTTPError(406, "NOT_ACCEPTABLE", "streaming is not served by this function")
    if answer.status == 204:  # no body at all
        return {"statusCode": 204, "headers": answer.headers, "body": "", "isBase64Encoded": False}
    return http_response(answer.status, answer.doc, answer.headers or None)


def _budget(context: Any) -> float:
    """Seconds a sync request may wait: API Gateway's limit and the function's remaining time,
    less a margin to answer 504 in (the configured budget applies too, in the front)."""
    budget = API_GATEWAY_LIMIT_SECONDS - ANSWER_MARGIN_SECONDS
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is not None:
        budget = min(budget, remaining() / 1000 - ANSWER_MARGIN_SECONDS)
    return max(budget, 0.0)
