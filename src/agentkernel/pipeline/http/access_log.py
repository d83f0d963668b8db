"""One log line per HTTP request or WebSocket connection (``api.access_log``).

Lines go to the ``agentkernel.access`` logger at INFO::

    127.0.0.1:53211 "POST /api/v1/chat" 200 12.4ms request_id=9f2c... user=alice

The request id is read from the answer's ``Location``/``Content-Location`` header when it has
one, so a line can be matched with the runner's lines for the same turn. Query values that may
hold a credential (``?token=`` on the WebSocket handshake) are masked, control characters a client
put in a path or user id are escaped (no forged lines), and no header is logged.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from agentkernel.core.redact import MASK, printable, redact_queries, redact_query
from agentkernel.pipeline.front.sessions import SESSIONS_PATH
from agentkernel.pipeline.http.subprotocols import AUTH_PREFIX
from agentkernel.pipeline.wire.chat import CHAT_PATH

logger = logging.getLogger("agentkernel.access")

#: Key in the ASGI scope where the authentication middleware leaves the caller's user id.
SCOPE_USER = "agentkernel.user"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


#: A header line the WebSocket library logs at DEBUG (``< Authorization: Bearer ...``) whose
#: value is a credential.
_SECRET_HEADER = re.compile(
    r"^([<>] (?:authorization|proxy-authorization|x-api-key|cookie|set-cookie):).*",
    re.IGNORECASE | re.DOTALL,
)
#: Formats a traceback to mask it (as any handler would print it).
_FORMATTER = logging.Formatter()
#: A credential subprotocol (:mod:`.subprotocols`), wherever a line names it.
_CREDENTIAL_PROTOCOL = re.compile(re.escape(AUTH_PREFIX) + r"((?:key|bearer)\.)?[^,\r\n]*")


def redact_headers(text: str) -> str:
    """``text`` with the value of a credential header line and every credential subprotocol
    replaced by ``***``."""
    text = _SECRET_HEADER.sub(rf"\1 {MASK}", text)
    return _CREDENTIAL_PROTOCOL.sub(lambda m: f"{AUTH_PREFIX}{m.group(1) or ''}{MASK}", text)


class ServerLogFilter(logging.Filter):
    """Masks credentials and escapes control characters in the lines the HTTP server itself
    logs: uvicorn names the WebSocket path, ``?token=`` included, at INFO, and at DEBUG the
    WebSocket library logs every handshake header, ``Authorization`` and
    ``Sec-WebSocket-Protocol`` included, and the traceback of a handshake it refused, whose
    message quotes the header."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = printable(redact_headers(redact_queries(message)))
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info:
            text = _FORMATTER.formatException(record.exc_info)
            masked = redact_headers(redact_queries(text))
            if masked != text:  # formatters print exc_text when there is no exc_info
                record.exc_info, record.exc_text = None, masked
        return True


def protect_server_logs() -> None:
    """Install :class:`ServerLogFilter` on uvicorn's loggers (once)."""
    for name in ("uvicorn.error", "uvicorn.access", "uvicorn"):
        server_logger = logging.getLogger(name)
        if not any(isinstance(f, ServerLogFilter) for f in server_logger.filters):
            server_logger.addFilter(ServerLogFilter())


class AccessLogMiddleware:
    """ASGI middleware writing one access line when a request or connection ends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        seen: dict[str, Any] = {"status": 0, "request_id": "", "session_id": ""}

        async def watch(message: Message) -> None:
            kind = message["type"]
            if kind in ("http.response.start", "websocket.http.response.start"):
                seen["status"] = message["status"]
                seen.update(_turn_ids(message.get("headers") or [], scope))
            elif kind == "websocket.accept":
                seen["status"] = 101
            elif kind == "websocket.close" and not seen["status"]:
                seen["status"] = 403  # refused before the handshake completed
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            _write(scope, seen, (time.perf_counter() - started) * 1000)


def _write(scope: Scope, seen: dict[str, Any], elapsed_ms: float) -> None:
    client = scope.get("client") or ("-", 0)
    method = "WS" if scope["type"] == "websocket" else scope.get("method", "-")
    target = scope.get("path", "")
    query = scope.get("query_string", b"").decode("latin-1")
    if query:
        target += "?" + redact_query(query)
    tail = ""
    if seen["request_id"]:
        tail += f" request_id={seen['request_id']}"
    if user := scope.get(SCOPE_USER):
        tail += f" user={user}"
    target, tail = printable(target), printable(tail)
    logger.info(
        '%s:%s "%s %s" %s %.1fms%s',
        client[0],
        client[1],
        method,
        target,
        seen["status"] or "-",
        elapsed_ms,
        tail,
        # fields of a JSON line (logging.format: json); empty ones are left out
        extra={"request_id": seen["request_id"], "session_id": seen["session_id"]},
    )


def _turn_ids(headers: list[tuple[bytes, bytes]], scope: Scope) -> dict[str, str]:
    """The turn's request and session ids, from the answer's ``Location``/``Content-Location``
    (``/api/v1/chat/<session>?request_id=<id>``), else ``X-Request-Id``, else the request's own
    path and ``request_id`` query parameter (a poll)."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    request_id = query.get("request_id", [""])[0]
    session_id = _session_of(scope.get("path", "")) or query.get("session_id", [""])[0]
    for name, value in headers:
        if name.lower() == b"x-request-id":  # a streamed answer
            request_id = value.decode("latin-1")
        elif name.lower() in (b"location", b"content-location"):
            url = urlsplit(value.decode("latin-1"))
            request_id = parse_qs(url.query).get("request_id", [""])[0]
            session_id = _session_of(url.path) or session_id
            break
    return {"request_id": request_id, "session_id": session_id}


def _session_of(path: str) -> str:
    """The session id a chat or sessions path names (``""`` for any other path)."""
    for prefix in (CHAT_PATH + "/", SESSIONS_PATH + "/"):
        if path.startswith(prefix):
            return unquote(path[len(prefix) :].split("/", 1)[0])
    return ""
