"""The serverless request handler: ``Lambda.handler`` behind API Gateway.

Routes and answers are those of the containerized API (see docs/http-api.md), read from HTTP API
(payload 2.0) and REST API (1.0) proxy events. A ``rest_sync`` POST enqueues and then polls the
DynamoDB store with a short backoff, answering 504 with the ``request_id`` before the function's
remaining time or API Gateway's 29 seconds run out. WebSocket ``$default``/``chat`` messages are
enqueued with the connection as the reply address and answered ``CHAT_QUEUED``::

    from agentkernel.aws import Lambda

    @Lambda.register("/app", method="GET")
    def app_info(event, context):
        return {"version": "1"}

    handler = Lambda.handler
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any, ClassVar
from urllib.parse import quote

from agentkernel.aws.events import (
    BadEvent,
    HttpRequest,
    SocketMessage,
    http_response,
    parse_api_event,
)
from agentkernel.aws.settings import ecs_config
from agentkernel.core.agent import AgentRegistry
from agentkernel.core.config import AKConfig
from agentkernel.core.errors import (
    MessageRejectedError,
    StoreError,
    StoreUnavailableError,
)
from agentkernel.pipeline.admission import admit, missing_reply
from agentkernel.pipeline.chat import (
    ChatRequest,
    FrameError,
    HTTPError,
    check_agent,
    parse_chat,
    parse_frame,
    request_id_for,
    system_response,
    turn_message,
)
from agentkernel.pipeline.envelope import (
    ATTR_CONNECTION_ID,
    ATTR_ENDPOINT,
    ATTR_STREAM,
    ATTR_TRACEPARENT,
    QueueName,
)
from agentkernel.pipeline.response_store import (
    ResponseRecord,
    ResponseStore,
    create_response_store,
)
from agentkernel.pipeline.transport.base import QueueTransport, QueueTransportFactory

logger = logging.getLogger(__name__)

CHAT_PATH = "/api/v1/chat"
API_GATEWAY_LIMIT_SECONDS = 29.0
#: Time kept back from the function's remaining time to answer 504 before it ends.
ANSWER_MARGIN_SECONDS = 1.0
_CHAT_GET = re.compile(r"^/api/v1/chat/([^/]+)$")
Route = Callable[[dict[str, Any], Any], dict[str, Any]]


class Lambda:
    """The request handler function (class-level, as users' entry files expect)."""

    _routes: ClassVar[dict[tuple[str, str], Route]] = {}
    _parts: ClassVar[tuple[AKConfig, QueueTransport, ResponseStore] | None] = None

    @classmethod
    def register(cls, path: str, method: str = "GET") -> Callable[[Route], Route]:
        """Add a custom route: ``fn(event, context) -> dict``, answered as JSON 200."""

        def decorate(fn: Route) -> Route:
            cls._routes[(method.upper(), path)] = fn
            return fn

        return decorate

    @classmethod
    def reset(cls) -> None:
        """Forget custom routes and built clients (tests)."""
        cls._routes, cls._parts = {}, None

    @classmethod
    def parts(cls) -> tuple[AKConfig, QueueTransport, ResponseStore]:
        """Configuration, transport and store of this Lambda container (built once)."""
        if cls._parts is None:
            config = ecs_config()
            AKConfig.set(config)
            transport = QueueTransportFactory.create(config.execution.queues)
            cls._parts = (config, transport, create_response_store(config.execution.response_store))
        return cls._parts

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
            return http_response(exc.status, exc.doc, exc.headers or None)
        except StoreError as exc:
            logger.warning("response store failed: %s", exc)
            return _store_failure(exc)
        except Exception:
            logger.exception("unexpected failure of the request handler")
            return http_response(500, {"error": "INTERNAL_ERROR", "message": "unexpected error"})

    # -- HTTP ------------------------------------------------------------------------------

    @classmethod
    def _http(cls, request: HttpRequest, event: dict[str, Any], context: Any) -> dict[str, Any]:
        custom = cls._routes.get((request.method, request.path))
        if custom is not None:
            return http_response(200, custom(event, context))
        if request.method == "GET" and request.path == "/health":
            return http_response(200, {"status": "ok"})
        if request.method == "GET" and request.path == "/api/v1/agents":
            return http_response(200, _agents())
        if request.method == "POST" and request.path == CHAT_PATH:
            return cls._post_chat(request, context)
        if request.method == "GET" and (match := _CHAT_GET.match(request.path)):
            return cls._get_chat(match.group(1), request.query.get("request_id"))
        raise HTTPError(404, "NOT_FOUND", f"no route {request.method} {request.path}")

    @classmethod
    def _post_chat(cls, request: HttpRequest, context: Any) -> dict[str, Any]:
        config, transport, store = cls.parts()
        limit = config.api.max_body_bytes
        if len(request.body) > limit:
            raise HTTPError(413, "BODY_TOO_LARGE", f"request body exceeds {limit} bytes")
        chat = _check(parse_chat(request.body))
        key = request.headers.get("idempotency-key")
        secret = config.api.idempotency_secret
        request_id, fresh = request_id_for(
            chat.session_id, key, None, None if secret is None else secret.get_secret_value()
        )
        admit(store, chat, request_id, None)
        if not fresh and (known := store.get(request_id)) is not None:
            return _record_answer(known)
        traceparent = request.headers.get("traceparent", "")
        _enqueue(
            transport, chat, request_id, {ATTR_TRACEPARENT: traceparent} if traceparent else {}
        )
        prefer = request.headers.get("prefer", "").lower()
        if config.execution.mode != "rest_sync" or "respond-async" in prefer:
            return http_response(
                202, _accepted(chat.session_id, request_id), _location(chat.session_id, request_id)
            )
        wait = config.execution.response_store.sync_wait(config.api.sync_timeout, store.pushes)
        try:
            record = _wait(store, request_id, _budget(wait, context))
        except StoreError as exc:  # the turn is queued: say where to read its reply
            logger.warning("response store failed for request %s: %s", request_id, exc)
            return _store_failure(exc, chat.session_id, request_id)
        if record is None:
            doc = {
                "error": "TIMEOUT",
                "message": "no reply within the wait budget; poll for it later",
                "request_id": request_id,
                "session_id": chat.session_id,
            }
            return http_response(504, doc, _location(chat.session_id, request_id))
        return _record_answer(record)

    @classmethod
    def _get_chat(cls, session_id: str, request_id: str | None) -> dict[str, Any]:
        if not request_id:
            raise HTTPError(400, "INVALID_REQUEST", "the request_id query parameter is required")
        store = cls.parts()[2]
        record = store.get(request_id)
        if record is None or record.session_id != session_id:
            raise missing_reply(store, session_id, request_id, None)
        return _record_answer(record)

    # -- WebSocket -------------------------------------------------------------------------

    @classmethod
    def _socket(cls, message: SocketMessage) -> dict[str, Any]:
        if message.event_type != "MESSAGE":
            return {"statusCode": 200}
        config, transport, store = cls.parts()
        request_id = None
        try:
            request_id, chat = parse_frame(
                message.body.decode("utf-8", "replace"), config.api.max_body_bytes
            )
            chat = _check(chat)
            attributes = {
                ATTR_CONNECTION_ID: message.connection_id,
                ATTR_ENDPOINT: message.endpoint,
            }
            if chat.stream:
                attributes[ATTR_STREAM] = "1"
            admit(store, chat, request_id, None)
            _enqueue(transport, chat, request_id, attributes)
        except FrameError as exc:
            frame = system_response(exc.code, str(exc), exc.request_id or request_id)
            return {"statusCode": 200, "body": json.dumps(frame)}
        except HTTPError as exc:
            frame = system_response(exc.doc["error"], exc.doc["message"], request_id)
            return {"statusCode": 200, "body": json.dumps(frame)}
        queued = {"type": "CHAT_QUEUED", "request_id": request_id, "session_id": chat.session_id}
        return {"statusCode": 200, "body": json.dumps(queued)}


def _check(chat: ChatRequest) -> ChatRequest:
    return check_agent(chat, AgentRegistry.default())


def _enqueue(
    transport: QueueTransport, chat: ChatRequest, request_id: str, attributes: dict[str, str]
) -> None:
    message = turn_message(chat, request_id, attributes)
    try:
        transport.send(QueueName.INPUT, message)
    except MessageRejectedError as exc:
        raise HTTPError(413, "MESSAGE_TOO_LARGE", str(exc), session_id=chat.session_id) from exc
    except Exception as exc:
        logger.warning("enqueue of request %s failed: %r", request_id, exc)
        raise HTTPError(
            503,
            "QUEUE_UNAVAILABLE",
            "the turn may not have been queued; poll the request_id, or retry with the same "
            "Idempotency-Key",
            request_id=request_id,
            session_id=chat.session_id,
        ) from exc


def _budget(sync_timeout: float, context: Any) -> float:
    """Seconds a sync request may wait: the configured budget, API Gateway's limit, and the
    function's remaining time, less a margin to answer 504 in."""
    budget = min(sync_timeout, API_GATEWAY_LIMIT_SECONDS - ANSWER_MARGIN_SECONDS)
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is not None:
        budget = min(budget, remaining() / 1000 - ANSWER_MARGIN_SECONDS)
    return max(budget, 0.0)


def _wait(store: ResponseStore, request_id: str, budget: float) -> ResponseRecord | None:
    deadline = time.monotonic() + budget
    interval = 0.05
    while True:
        record = store.get(request_id)
        remaining = deadline - time.monotonic()
        if record is not None or remaining <= 0:
            return record
        time.sleep(min(interval, remaining))
        interval = min(interval * 1.5, store.max_poll_interval)


def _record_answer(record: ResponseRecord) -> dict[str, Any]:
    """A stored reply as it was answered (its request id is derived from its session)."""
    return http_response(record.status_code, record.body)


def _store_failure(exc: StoreError, session_id: str = "", request_id: str = "") -> dict[str, Any]:
    """503 ``STORE_UNAVAILABLE`` (retry later) or 500 ``STORE_ERROR``; for a turn that is already
    queued, with its ``request_id`` and a ``Location`` to poll."""
    headers: dict[str, str] = {}
    if isinstance(exc, StoreUnavailableError):
        status, doc = (
            503,
            {"error": "STORE_UNAVAILABLE", "message": "the reply store is unreachable"},
        )
        headers["Retry-After"] = "1"
    else:
        status, doc = 500, {"error": "STORE_ERROR", "message": "the reply store failed"}
    if request_id:
        doc |= {"request_id": request_id, "session_id": session_id}
        headers |= _location(session_id, request_id)
    return http_response(status, doc, headers)


def _accepted(session_id: str, request_id: str) -> dict[str, str]:
    return {"status": "ACCEPTED", "request_id": request_id, "session_id": session_id}


def _location(session_id: str, request_id: str) -> dict[str, str]:
    return {"Location": f"{CHAT_PATH}/{quote(session_id, safe='')}?request_id={request_id}"}


def _agents() -> dict[str, Any]:
    agents = AgentRegistry.default().agents()
    return {
        "agents": [
            {"name": a.name, "description": a.description, "streaming": a.streaming} for a in agents
        ]
    }
