"""The serverless WebSocket connection handler: ``$connect`` and ``$disconnect``.

``$connect`` reads a token from the ``token`` query parameter or the ``Authorization: Bearer``
header, asks the configured :class:`~agentkernel.auth.AuthValidator` (when there is one), and
stores the connection (with the user id the validator returned) in a DynamoDB table with a TTL;
a refused token answers 401 and stores nothing. ``$disconnect`` removes the record::

    handler = WebsocketConnectionHandler.set_auth_validator(MyValidator()).handler
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, ClassVar

from agentkernel.auth import AuthValidator
from agentkernel.aws.events import BadEvent, SocketMessage, http_response, parse_api_event
from agentkernel.core.botocore_errors import botocore_errors, client
from agentkernel.core.config.root import AKConfig
from agentkernel.core.errors import ResponseStoreError

logger = logging.getLogger(__name__)
# Every failure of this table, an outage included, is the ResponseStoreError its callers handle.
_errors = functools.partial(
    botocore_errors, unavailable=ResponseStoreError, failed=ResponseStoreError
)


class ConnectionStore:
    """Open WebSocket connections: hash key ``connection_id``, TTL attribute ``expiry_time``.

    Args:
        table_name: the DynamoDB table.
        ttl: seconds a connection record lives.

    Raises:
        AKConfigError: no AWS region is configured.
    """

    def __init__(self, table_name: str, ttl: float = 7200.0) -> None:
        self.table_name, self.ttl = table_name, ttl
        self._client = client("dynamodb", "api.websocket.connections_table")

    def add(self, connection_id: str, user_id: str | None, expires_at: float | None = None) -> None:
        """Keep the connection of ``user_id`` (an identity) until its credential expires at
        ``expires_at`` (Unix seconds) or the TTL ends, whichever comes first: after that
        :meth:`get` finds no record and the request handler refuses the connection's frames."""
        expiry = time.time() + self.ttl
        if expires_at is not None:
            expiry = min(expiry, expires_at)
        item = {
            "connection_id": {"S": connection_id},
            "connected_at": {"N": str(int(time.time()))},
            "expiry_time": {"N": f"{expiry:.3f}"},
        }
        if user_id is not None:
            item["user_id"] = {"S": user_id}
        self._call("put_item", Item=item)

    def get(self, connection_id: str) -> dict[str, str] | None:
        """The connection's record (``connection_id``, ``user_id``), or ``None``."""
        item = self._call("get_item", Key={"connection_id": {"S": connection_id}}).get("Item")
        if item is None or float(item["expiry_time"]["N"]) <= time.time():
            return None
        return {k: next(iter(v.values())) for k, v in item.items()}

    def remove(self, connection_id: str) -> None:
        self._call("delete_item", Key={"connection_id": {"S": connection_id}})

    def _call(self, operation: str, **kwargs: Any) -> Any:
        with _errors(f"DynamoDB {operation} on {self.table_name}"):
            return getattr(self._client, operation)(TableName=self.table_name, **kwargs)


class WebsocketConnectionHandler:
    """Lambda entry for the WebSocket API's ``$connect`` and ``$disconnect`` routes."""

    _validator: ClassVar[AuthValidator | None] = None
    _store: ClassVar[ConnectionStore | None] = None

    @classmethod
    def set_auth_validator(
        cls, auth_validator: AuthValidator | None
    ) -> type[WebsocketConnectionHandler]:
        """Check every ``$connect`` token with ``auth_validator`` (``None``: accept every
        connection under the authorizer's identity); returns the class for chaining."""
        cls._validator = auth_validator
        return cls

    @classmethod
    def store(cls) -> ConnectionStore:
        if cls._store is None:
            websocket = AKConfig.get().api.websocket
            if not websocket.connections_table:
                from agentkernel.core.errors import AKConfigError

                raise AKConfigError(
                    "api.websocket.connections_table: required by the connection handler "
                    "(AK_API__WEBSOCKET__CONNECTIONS_TABLE)"
                )
            cls._store = ConnectionStore(websocket.connections_table, websocket.connection_ttl)
        return cls._store

    @classmethod
    def reset(cls) -> None:
        cls._validator, cls._store = None, None

    @classmethod
    def handler(cls, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        """Lambda entry: 200 to accept, 401 to refuse a connection."""
        try:
            message = parse_api_event(event)
        except BadEvent as exc:
            return http_response(400, {"error": "BAD_EVENT", "message": str(exc)})
        if not isinstance(message, SocketMessage):
            return http_response(400, {"error": "BAD_EVENT", "message": "not a WebSocket event"})
        if message.event_type == "DISCONNECT":
            cls.store().remove(message.connection_id)
            return {"statusCode": 200}
        if message.event_type != "CONNECT":
            return {"statusCode": 200}
        return cls._connect(message)

    @classmethod
    def _connect(cls, message: SocketMessage) -> dict[str, Any]:
        user_id, expires_at = message.identity, None
        if cls._validator is not None:
            token = _token(message)
            if not token:
                return http_response(
                    401, {"error": "UNAUTHORIZED", "message": "a token is required"}
                )
            result = cls._validator.validate(token)
            user_id = result.identity(cls._validator.scheme)
            if not result.is_valid or user_id is None:
                reason = result.error_msg or "invalid token"
                return http_response(401, {"error": "UNAUTHORIZED", "message": reason})
            expires_at = result.expires_at
        cls.store().add(message.connection_id, user_id, expires_at)
        return {"statusCode": 200}


def _token(message: SocketMessage) -> str | None:
    if token := message.query.get("token"):
        return token
    scheme, _, value = message.headers.get("authorization", "").partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None
