"""Replies in a DynamoDB table (partition key ``request_id``, TTL attribute ``expiry_time``).

A reply item has ``request_id``, ``session_id``, ``status_code``, ``body`` (the reply as a JSON
string), ``expiry_time`` and, with authentication on, ``owner``. Items written by upstream
agentkernel in the same table (``body`` a map, ``expiry_time`` absent when its TTL was 0) are
read as well, so turns accepted before a migration can still be polled after it.

DynamoDB has no change notification a request could wait on cheaply, so a waiting sync request
polls with a short, growing interval (the base class's ``wait``). DynamoDB removes expired items
lazily (up to days later), so reads also ignore items whose ``expiry_time`` has passed.
Chunks of streamed replies, and the ticket of an accepted turn, are items of their own; streaming
clients read chunks with the same short poll. The request ids of a session's tickets and replies
are string sets, so a session can be erased: one item per hour,
``#turns#<session key>#<period>`` (same TTL), so that a session busy for days does not grow one
item towards DynamoDB's 400 KB limit, each write of it costing more capacity than the last.
Earlier versions kept one item, ``#turns#<session key>``; it is still read and erased.
The per-identity quota counts are one item per
identity in the same table (:mod:`agentkernel.pipeline.quota.dynamodb`).

Every botocore exception is mapped by :mod:`agentkernel.core.botocore_errors`: an unreachable
endpoint, a timeout, throttling or a server error becomes :class:`StoreUnavailableError` (worth
retrying), anything else :class:`ResponseStoreError`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import secrets
import time
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer
from botocore.config import Config

from agentkernel.core.botocore_errors import (
    CONDITION_FAILED,
    botocore_errors,
    client,
    error_code,
    table_check,
)
from agentkernel.core.config.stores import DynamoDBStoreConfig
from agentkernel.core.errors import ResponseStoreError, StoreUnavailableError
from agentkernel.pipeline.quota import QuotaLedger
from agentkernel.pipeline.quota.dynamodb import TTL_ATTRIBUTE
from agentkernel.pipeline.response_store.base import ResponseStore
from agentkernel.pipeline.wire.records import (
    ResponseRecord,
    TurnTicket,
    index_period,
    index_periods,
)
from agentkernel.pipeline.wire.scoping import session_key

_CHUNK = "#chunk#"  # chunk items share the table: key "<request_id>#chunk#<index>"
_TICKET = "#ticket"  # the ticket of an accepted turn: key "<request_id>#ticket"
_SECRET = "#secret"  # the deployment secret (shared_secret), no TTL
_TURNS = "#turns#"  # a session's request ids: key "#turns#<session key>#<period>" (ids have no '#')
#: Fail fast when the table cannot be reached, so an API request can answer 503 in seconds.
_CLIENT_CONFIG = Config(
    connect_timeout=2, read_timeout=5, retries={"max_attempts": 3, "mode": "standard"}
)
_errors = functools.partial(
    botocore_errors, unavailable=StoreUnavailableError, failed=ResponseStoreError, unreadable=True
)


class DynamoDBResponseStore(ResponseStore):
    """Response store on a DynamoDB table.

    Args:
        table_name: the table; its partition key is the string ``request_id``.
        ttl: seconds a record stays readable.
        region_name: AWS region; default from the environment.
        endpoint_url: override the endpoint (``AWS_ENDPOINT_URL`` works too).
    """

    shared = True
    keeps_tickets = True
    erases_sessions = True
    max_poll_interval = 0.25

    def __init__(
        self,
        table_name: str,
        ttl: float = 3600.0,
        region_name: str | None = None,
        endpoint_url: str | None = None,
    ) -> None:
        super().__init__(ttl)
        self.table_name = table_name
        self._client = client(
            "dynamodb",
            "execution.response_store.dynamodb",
            region_name=region_name,
            endpoint_url=endpoint_url,
            config=_CLIENT_CONFIG,
        )
        self._secret: bytes | None = None

    @classmethod
    def from_config(cls, config: DynamoDBStoreConfig, ttl: float) -> DynamoDBResponseStore:
        return cls(config.table_name or "", ttl, config.region_name, config.endpoint_url)

    def put(self, record: ResponseRecord) -> None:
        item: dict[str, Any] = {
            "request_id": {"S": record.request_id},
            "session_id": {"S": record.session_id},
            "status_code": {"N": str(record.status_code)},
            "body": {"S": json.dumps(record.body)},
            TTL_ATTRIBUTE: {"N": str(math.ceil(time.time() + self.ttl))},
        }
        if record.owner is not None:
            item["owner"] = {"S": record.owner}
        with _errors(f"DynamoDB write of {record.request_id}"):
            self._client.put_item(TableName=self.table_name, Item=item)
        self._index(record.session_id, record.owner, record.request_id)

    def _index(self, session_id: str, owner: str | None, request_id: str) -> None:
        """Add ``request_id`` to its session's set (after its item: a crash between leaves an
        unindexed turn, which the session record's ids still name to an erase)."""
        key = session_key(session_id, owner)
        with _errors(f"DynamoDB index of {request_id}"):
            self._client.update_item(
                TableName=self.table_name,
                Key={"request_id": {"S": self._turns_item(key, index_period())}},
                UpdateExpression="ADD turns :id SET #exp = :exp",
                ExpressionAttributeNames={"#exp": TTL_ATTRIBUTE},
                ExpressionAttributeValues={
                    ":id": {"SS": [request_id]},
                    ":exp": {"N": str(math.ceil(time.time() + self.ttl))},
                },
            )

    def get(self, request_id: str) -> ResponseRecord | None:
        with _errors(f"DynamoDB read of {request_id}"):
            reply = self._client.get_item(
                TableName=self.table_name,
                Key={"request_id": {"S": request_id}},
                ConsistentRead=True,
            )
            item = reply.get("Item")
            if item is None or "session_id" not in item:  # none, or a chunk, ticket, secret
                return None
            if _expired(item):
                return None
            return ResponseRecord(
                request_id=request_id,
                session_id=item["session_id"]["S"],
                status_code=int(item["status_code"]["N"]),
                body=_reply_body(item["body"]),
                owner=item.get("owner", {}).get("S"),
            )

    def accept(self, ticket: TurnTicket) -> TurnTicket | None:
        item: dict[str, Any] = {
            "request_id": {"S": ticket.request_id + _TICKET},
            "body": {"S": ticket.to_json()},
            TTL_ATTRIBUTE: {"N": str(math.ceil(time.time() + self.ttl))},
        }
        try:
            with _errors(f"DynamoDB write of the ticket of {ticket.request_id}"):
                self._client.put_item(
                    TableName=self.table_name,
                    Item=item,
                    # first copy wins, unless it has expired and is not removed yet
                    ConditionExpression="attribute_not_exists(request_id) OR #exp < :now",
                    ExpressionAttributeNames={"#exp": TTL_ATTRIBUTE},
                    ExpressionAttributeValues={":now": {"N": str(math.floor(time.time()))}},
                )
        except ResponseStoreError as exc:
            if error_code(exc.__cause__) != CONDITION_FAILED:
                raise
            return self.ticket(ticket.request_id)
        self._index(ticket.session_id, ticket.owner, ticket.request_id)
        return None

    def ticket(self, request_id: str) -> TurnTicket | None:
        with _errors(f"DynamoDB read of the ticket of {request_id}"):
            item = self._client.get_item(
                TableName=self.table_name,
                Key={"request_id": {"S": request_id + _TICKET}},
                ConsistentRead=True,
            ).get("Item")
            if item is None or float(item[TTL_ATTRIBUTE]["N"]) <= time.time():
                return None
            return TurnTicket.from_json(item["body"]["S"])

    def put_chunk(self, request_id: str, index: int, frame: dict[str, Any]) -> None:
        item = {
            "request_id": {"S": f"{request_id}{_CHUNK}{index}"},
            "body": {"S": json.dumps(frame)},
            TTL_ATTRIBUTE: {"N": str(math.ceil(time.time() + self.ttl))},
        }
        try:
            with _errors(f"DynamoDB write of a chunk of {request_id}"):
                self._client.put_item(
                    TableName=self.table_name,
                    Item=item,
                    ConditionExpression="attribute_not_exists(request_id)",  # first copy wins
                )
        except ResponseStoreError as exc:
            if error_code(exc.__cause__) != CONDITION_FAILED:
                raise

    def chunks(self, request_id: str, after: int = -1) -> list[dict[str, Any]]:
        """Reads chunk items one by one from ``after + 1`` until one is missing (at most 100)."""
        found: list[dict[str, Any]] = []
        with _errors(f"DynamoDB read of chunks of {request_id}"):
            for index in range(after + 1, after + 101):
                key = {"request_id": {"S": f"{request_id}{_CHUNK}{index}"}}
                item = self._client.get_item(
                    TableName=self.table_name, Key=key, ConsistentRead=True
                ).get("Item")
                if item is None:
                    break
                found.append(json.loads(item["body"]["S"]))
        return found

    def _turns_items(self, key: str) -> list[str]:
        """The index items that can name a live turn of the session, and the single item of
        earlier versions."""
        return [self._turns_item(key, n) for n in index_periods(self.ttl)] + [_TURNS + key]

    @staticmethod
    def _turns_item(key: str, period: int) -> str:
        return f"{_TURNS}{key}#{period}"

    def _session_requests(self, key: str) -> list[str]:
        found: set[str] = set()
        with _errors(f"DynamoDB read of the turns of session {key}"):
            for name in self._turns_items(key):
                item = self._client.get_item(
                    TableName=self.table_name,
                    Key={"request_id": {"S": name}},
                    ConsistentRead=True,
                ).get("Item")
                found.update([] if item is None else item.get("turns", {}).get("SS", []))
        return list(found)

    def _erase_turn(self, request_id: str) -> bool:
        found = False
        with _errors(f"DynamoDB erase of {request_id}"):
            for key in (request_id, request_id + _TICKET):
                found = self._delete(key) or found
            index = 0
            while self._delete(f"{request_id}{_CHUNK}{index}"):  # chunks are numbered from 0
                index += 1
        return found or index > 0

    def _delete(self, key: str) -> bool:
        reply = self._client.delete_item(
            TableName=self.table_name, Key={"request_id": {"S": key}}, ReturnValues="ALL_OLD"
        )
        return bool(reply.get("Attributes"))

    def _forget_requests(self, key: str) -> None:
        with _errors(f"DynamoDB erase of the turns of session {key}"):
            for name in self._turns_items(key):
                self._delete(name)

    def shared_secret(self) -> bytes:
        """Kept in the item ``#secret`` without a TTL; the first process to write it wins."""
        if self._secret is None:
            key = {"request_id": {"S": _SECRET}}
            item = {**key, "secret": {"S": secrets.token_hex(32)}}
            with _errors(f"DynamoDB read of the deployment secret in {self.table_name}"):
                # another process may have made it first: then read that one
                with contextlib.suppress(self._client.exceptions.ConditionalCheckFailedException):
                    self._client.put_item(
                        TableName=self.table_name,
                        Item=item,
                        ConditionExpression="attribute_not_exists(request_id)",
                    )
                kept = self._client.get_item(
                    TableName=self.table_name, Key=key, ConsistentRead=True
                ).get("Item")
            if kept is None or "secret" not in kept:
                raise ResponseStoreError(f"no deployment secret in {self.table_name}; retry")
            self._secret = kept["secret"]["S"].encode()
        return self._secret

    def _new_quota_ledger(self) -> QuotaLedger:
        """Counts in this table, shared by every front using it (one item per identity)."""
        from agentkernel.pipeline.quota.dynamodb import DynamoDBQuotaLedger

        return DynamoDBQuotaLedger(self._client, self.table_name, self.ttl)

    def ping(self) -> None:
        with table_check(
            self.table_name,
            "execution.response_store.dynamodb",
            unavailable=StoreUnavailableError,
            failed=ResponseStoreError,
        ):
            self._client.describe_table(TableName=self.table_name)

    def close(self) -> None:
        with _errors("DynamoDB close"):
            self._client.close()


def _expired(item: dict[str, Any]) -> bool:
    """Past its ``expiry_time``; an item without one (upstream with TTL 0) does not expire."""
    expiry = item.get(TTL_ATTRIBUTE)
    return expiry is not None and float(expiry["N"]) <= time.time()


def _reply_body(attribute: dict[str, Any]) -> dict[str, Any]:
    """The reply document: a JSON string here, a map where upstream agentkernel wrote it."""
    if "S" in attribute:
        body: dict[str, Any] = json.loads(attribute["S"])
        return body
    return dict(_plain(TypeDeserializer().deserialize(attribute)))


def _plain(value: Any) -> Any:
    """A deserialized DynamoDB value as JSON values: numbers come back as ``Decimal``."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, set, frozenset)):
        return [_plain(item) for item in value]
    return value
