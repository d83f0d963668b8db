"""The request handler's paths: custom routes, the API base path and the poll forms.

A custom route registered as ``/app`` answers at ``/app`` and under the API base path,
``/api/v1/app``, where upstream deployments' API Gateway routes put it. The base path is
``/api/v1``, or ``/{API_BASE_PATH}/{API_VERSION}`` when upstream's Terraform module set those
variables on the function; with ``AGENT_ENDPOINT`` set too, ``{base}/{AGENT_ENDPOINT}`` is
another name of ``/api/v1/chat``.

The sessions API answers at ``/api/v1/sessions`` (``GET``) and ``/api/v1/sessions/{session_id}``
(``GET``, ``DELETE``), as on the FastAPI front.

A turn's reply is read by any of three forms, all through the chat front's one visibility rule:
``GET /api/v1/chat/{session_id}?request_id=``, ``GET /api/v1/chat?session_id=&request_id=``,
and ``GET /api/v1/chat`` with ``{"session_id": ..., "request_id": ...}`` as its JSON body.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

from agentkernel.aws.events import HttpRequest, http_response
from agentkernel.pipeline.front.sessions import SESSIONS_PATH
from agentkernel.pipeline.wire.chat import CHAT_PATH, HTTPError

#: A custom route: ``fn(event, context)`` returning a document, ``(status, document)`` or a
#: complete API Gateway response (a dict with ``statusCode`` and ``body``).
Route = Callable[[dict[str, Any], Any], Any]

DEFAULT_BASE_PATH = "/api/v1"
#: Variables upstream's Terraform module sets on the request handler function.
BASE_PATH_ENV, VERSION_ENV, AGENT_ENDPOINT_ENV = "API_BASE_PATH", "API_VERSION", "AGENT_ENDPOINT"
_SESSION_PATH = re.compile(rf"^{re.escape(CHAT_PATH)}/([^/]+)$")
_CANCEL_PATH = re.compile(rf"^{re.escape(CHAT_PATH)}/([^/]+)/cancel$")
_SESSIONS = re.compile(rf"^{re.escape(SESSIONS_PATH)}(?:/([^/]+))?$")


def normalize(route: str) -> str:
    """``route`` with one leading slash and no trailing one (``app/`` -> ``/app``)."""
    return "/" + route.strip("/")


def base_paths() -> list[str]:
    """The API base paths custom routes are served under."""
    bases = [DEFAULT_BASE_PATH]
    base, version = os.environ.get(BASE_PATH_ENV), os.environ.get(VERSION_ENV)
    if base and version and (named := normalize(f"{base}/{version}")) not in bases:
        bases.append(named)
    return bases


def under_base(path: str) -> str | None:
    """``path`` without its API base path, or ``None`` when it is not under one."""
    for base in base_paths():
        if path.startswith(base + "/"):
            return path[len(base) :]
    return None


def chat_alias(path: str) -> str:
    """``path``, or :data:`CHAT_PATH` when it is upstream's configured agent endpoint."""
    base, version = os.environ.get(BASE_PATH_ENV), os.environ.get(VERSION_ENV)
    endpoint = os.environ.get(AGENT_ENDPOINT_ENV)
    if base and version and endpoint and path == normalize(f"{base}/{version}/{endpoint}"):
        return CHAT_PATH
    return path


def custom_response(result: Any) -> dict[str, Any]:
    """A custom route's result as an API Gateway response.

    A dict with ``statusCode`` and ``body`` is passed through; ``(status, document)`` answers
    that status; any other value answers 200, as JSON unless it is a string (sent as text).
    """
    if isinstance(result, dict) and "statusCode" in result and "body" in result:
        return result
    status = 200
    if isinstance(result, tuple) and len(result) == 2:
        status, result = int(result[0]), result[1]
    if isinstance(result, str):
        headers = {"Content-Type": "text/plain; charset=utf-8"}
        return {"statusCode": status, "headers": headers, "body": result}
    return http_response(status, result)


def is_read(request: HttpRequest, path: str) -> bool:
    """Whether ``request`` reads a reply, in any of the three forms."""
    return request.method == "GET" and (path == CHAT_PATH or bool(_SESSION_PATH.match(path)))


def cancel_route(request: HttpRequest, path: str) -> str | None:
    """The session id of ``POST /api/v1/chat/{session_id}/cancel``, or ``None`` when
    ``request`` is not a cancel."""
    match = _CANCEL_PATH.match(path)
    if request.method != "POST" or match is None:
        return None
    return _text(match.group(1), "session_id")


def sessions_route(request: HttpRequest) -> tuple[str, str | None] | None:
    """``(method, session_id)`` of a sessions API request (``session_id`` ``None`` for the
    listing), or ``None`` when ``request`` is not one."""
    match = _SESSIONS.match(request.path)
    if match is None:
        return None
    session_id = match.group(1)
    if request.method == "GET" or (request.method == "DELETE" and session_id is not None):
        return request.method, None if session_id is None else _text(session_id, "session_id")
    return None


def read_address(request: HttpRequest, path: str, max_body_bytes: int) -> tuple[str, str | None]:
    """``(session_id, request_id)`` of a read (see :func:`is_read`).

    Raises:
        HTTPError: 400 ``INVALID_REQUEST`` for a read that does not name both (400
            ``INVALID_JSON`` or 413 ``BODY_TOO_LARGE`` for a body that cannot be one).
    """
    if match := _SESSION_PATH.match(path):  # the front answers a missing request_id
        return _text(match.group(1), "session_id"), request.query.get("request_id")
    if request.query.get("request_id") or request.query.get("session_id") or not request.body:
        fields: dict[str, Any] = request.query
        where = "query parameter"
    else:
        fields, where = _body_fields(request.body, max_body_bytes), "body field"
    return _named(fields, "session_id", where), _named(fields, "request_id", where)


def _body_fields(body: bytes, limit: int) -> dict[str, Any]:
    """The fields of a poll body: top level, or under ``body`` (upstream's envelope form)."""
    if len(body) > limit:
        raise HTTPError(413, "BODY_TOO_LARGE", f"request body exceeds {limit} bytes")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise HTTPError(400, "INVALID_JSON", "the body is not valid JSON") from exc
    if not isinstance(data, dict):
        raise HTTPError(400, "INVALID_JSON", "the body must be a JSON object")
    inner = data.get("body")
    return (inner if isinstance(inner, dict) else {}) | data


def _named(fields: dict[str, Any], name: str, where: str) -> str:
    value = fields.get(name)
    if not isinstance(value, str) or not value:
        raise HTTPError(400, "INVALID_REQUEST", f"the {name} {where} is required (a string)")
    return _text(value, name)


def _text(value: str, name: str) -> str:
    """``value``, refused when it cannot be encoded (a lone surrogate from the event's JSON)."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise HTTPError(400, "INVALID_TEXT", f"{name} is not encodable text", field=name) from exc
    return value
