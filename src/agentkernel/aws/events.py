"""AWS Lambda event shapes in and out: API Gateway (HTTP API 2.0, REST 1.0, WebSocket) and SQS.

Only the standard library and the pipeline's envelope are imported here, so parsing an event
costs nothing on a cold start.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from agentkernel.auth import qualified_identity
from agentkernel.pipeline.wire.envelope import QueueMessage


class BadEvent(ValueError):
    """An event this handler cannot read (a missing field, an undecodable body)."""


@dataclass
class HttpRequest:
    """An API Gateway HTTP request, whichever payload version carried it."""

    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    identity: str | None = None  # the caller, as API Gateway's authorizer established it


@dataclass
class SocketMessage:
    """An API Gateway WebSocket event."""

    event_type: str  # CONNECT, MESSAGE or DISCONNECT
    route: str
    connection_id: str
    endpoint: str  # the management API endpoint that reaches this connection
    headers: dict[str, str] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    identity: str | None = None


def parse_api_event(event: dict[str, Any]) -> HttpRequest | SocketMessage:
    """Read an API Gateway proxy event (HTTP API 2.0, REST 1.0 or WebSocket).

    Raises:
        BadEvent: not an API Gateway event, or a body that is not valid base64.
    """
    context = event.get("requestContext") or {}
    headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
    query = {str(k): str(v) for k, v in (event.get("queryStringParameters") or {}).items()}
    body = _body(event)
    if "connectionId" in context:
        domain, stage = context.get("domainName", ""), context.get("stage", "")
        return SocketMessage(
            event_type=str(context.get("eventType", "MESSAGE")),
            route=str(context.get("routeKey", "$default")),
            connection_id=str(context["connectionId"]),
            endpoint=f"https://{domain}/{stage}" if stage else f"https://{domain}",
            headers=headers,
            query=query,
            body=body,
            identity=authorized_identity(context),
        )
    if event.get("version") == "2.0":
        http = context.get("http") or {}
        method, path = http.get("method"), event.get("rawPath") or http.get("path")
    else:
        method, path = event.get("httpMethod"), event.get("path")
    if not method or not path:
        raise BadEvent("not an API Gateway proxy event (no method or path)")
    identity = authorized_identity(context)
    return HttpRequest(str(method).upper(), str(path), headers, query, body, identity)


def authorized_identity(context: dict[str, Any]) -> str | None:
    """The caller as API Gateway's authorizer named it, or ``None`` without an authorizer.

    Read from the places API Gateway puts it, qualified by its scheme as every front does
    (:func:`~agentkernel.auth.qualified_identity`): a JWT authorizer's claims (HTTP API) or a
    Cognito user pool's (REST API) give ``jwt:<iss>:<sub>``, the same identity the FastAPI
    front gives that token; a Lambda authorizer's ``principalId`` (REST and WebSocket APIs)
    gives ``lambda:<principalId>``.
    """
    authorizer = context.get("authorizer")
    if not isinstance(authorizer, dict):
        return None
    jwt = authorizer.get("jwt")
    if isinstance(jwt, dict):  # a JWT authorizer names its caller by the token's claims only
        return _from_claims(jwt.get("claims"))
    if (by_claims := _from_claims(authorizer.get("claims"))) is not None:
        return by_claims
    principal = authorizer.get("principalId")
    return (
        qualified_identity("lambda", principal)
        if isinstance(principal, str) and principal
        else None
    )


def _from_claims(claims: Any) -> str | None:
    if not isinstance(claims, dict):
        return None
    sub, iss = claims.get("sub"), claims.get("iss")
    if not isinstance(sub, str) or not sub:
        return None
    return qualified_identity("jwt", sub, iss if isinstance(iss, str) and iss else None)


def _body(event: dict[str, Any]) -> bytes:
    raw = event.get("body")
    if raw is None:
        return b""
    if event.get("isBase64Encoded"):
        try:
            return base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadEvent(f"the body is not valid base64: {exc}") from exc
    # A lone surrogate (the event's JSON may carry one) stays a JSON escape, for the chat
    # parser to refuse with the field named.
    return str(raw).encode("utf-8", "backslashreplace")


def http_response(status: int, doc: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """An API Gateway proxy response with a JSON body."""
    return {
        "statusCode": status,
        "headers": {"Content-Type": "application/json"} | (headers or {}),
        "body": json.dumps(doc),
        "isBase64Encoded": False,
    }


def sqs_message(record: dict[str, Any]) -> QueueMessage:
    """An SQS event source mapping record as a :class:`QueueMessage`.

    Raises:
        BadEvent: the record lacks the fields every SQS record has.
    """
    try:
        attributes = record.get("attributes") or {}
        defects: list[str] = []
        message_attributes = _message_attributes(record.get("messageAttributes") or {}, defects)
        return QueueMessage(
            body=str(record["body"]),
            attributes=message_attributes,
            undecodable="; ".join(defects) or None,
            group_id=attributes.get("MessageGroupId"),
            dedup_id=attributes.get("MessageDeduplicationId"),
            receive_count=int(attributes.get("ApproximateReceiveCount", 1)),
            message_id=str(record["messageId"]),
            native=record.get("receiptHandle"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BadEvent(f"not an SQS record: {exc!r}") from exc


def _message_attributes(raw: dict[str, dict[str, Any]], defects: list[str]) -> dict[str, str]:
    """Lambda's spelling of message attributes (``stringValue``/``dataType``) as plain strings.

    A binary attribute that is not base64 of UTF-8 (no producer of ours writes one) is left out
    and named in ``defects``: the record is then refused as undecodable, not dropped.
    """
    out = {}
    for name, attr in raw.items():
        kind = str(attr.get("dataType", "String"))
        if kind == "String.empty":  # how the SQS transport sends an empty value
            out[name] = ""
        elif kind.startswith("Binary"):
            try:
                out[name] = base64.b64decode(attr.get("binaryValue") or b"").decode()
            except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
                defects.append(f"message attribute {name!r} is not UTF-8")
        else:
            out[name] = str(attr.get("stringValue", ""))
    return out
