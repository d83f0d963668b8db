"""Session records in DynamoDB: partition key ``session_id``, ``v``, ``doc`` (JSON), and the
TTL attribute ``expiry_time``. A commit is one conditional put on ``v``.

Listing an identity's sessions needs a global secondary index on the table, named
:data:`OWNER_INDEX` (``by_owner``): partition key ``owner_scope`` (string), sort key
``active_at`` (number, milliseconds since the epoch of the last write), keys-only projection.
Every write sets both attributes (a session's scope: :func:`~.index.scope_of`), so the index
follows the commits with DynamoDB's own replication; erasing a session deletes its one item.

Every botocore exception is mapped by :mod:`agentkernel.core.botocore_errors`, with the response
store's rule: throttling, a server error or an unreachable endpoint becomes
:class:`SessionStoreUnavailableError` (worth retrying), anything else :class:`SessionStoreError`;
a record over DynamoDB's 400 KB item limit is :class:`SessionStateError` (the agent's state is
too large, and every attempt would be refused alike).
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

from agentkernel.core.botocore_errors import (
    CONDITION_FAILED,
    botocore_errors,
    client,
    error_code,
    table_check,
)
from agentkernel.core.errors import (
    SessionStateError,
    SessionStoreError,
    SessionStoreUnavailableError,
    StaleSessionError,
)
from agentkernel.pipeline.session_store.base import SessionRecord, SessionStore
from agentkernel.pipeline.session_store.index import (
    SessionEntry,
    SessionPage,
    now_ms,
    page_of,
    scope_of,
)
from agentkernel.pipeline.turn_control.signals import TurnSignals
from agentkernel.pipeline.turn_control.signals_dynamodb import DynamoDBTurnSignals

_errors = functools.partial(
    botocore_errors, unavailable=SessionStoreUnavailableError, failed=SessionStoreError
)
#: The key :meth:`DynamoDBSessionStore.ping` reads; only read, so harmless if it exists.
_PROBE = "agentkernel:ping"
#: The global secondary index that lists an identity's sessions (see the module docstring).
OWNER_INDEX = "by_owner"


class DynamoDBSessionStore(SessionStore):
    """Args: table_name; ttl: seconds a session lives after a write; region_name; endpoint_url.

    Raises:
        AKConfigError: no AWS region is configured, or a setting is invalid.
    """

    lists_sessions = True

    def __init__(
        self,
        table_name: str,
        ttl: float = 604800.0,
        region_name: str | None = None,
        endpoint_url: str | None = None,
    ) -> None:
        self._table = table_name
        self._ttl = ttl
        self._client = client(
            "dynamodb", "session.dynamodb", region_name=region_name, endpoint_url=endpoint_url
        )

    def read(self, session_id: str) -> SessionRecord:
        with _errors(f"DynamoDB read of session {session_id}"):
            item = self._client.get_item(
                TableName=self._table, Key={"session_id": {"S": session_id}}, ConsistentRead=True
            ).get("Item")
        if item is None:
            return SessionRecord()
        version = int(item["v"]["N"])
        if float(item["expiry_time"]["N"]) <= time.time():
            # Expired but not yet removed by DynamoDB: empty, but the version still fences.
            return SessionRecord(version=version)
        return SessionRecord.decode(item["doc"]["S"], version)

    def write(self, session_id: str, record: SessionRecord, *, expected_version: int) -> None:
        item = {
            "session_id": {"S": session_id},
            "v": {"N": str(record.version)},
            "doc": {"S": record.encode()},
            "expiry_time": {"N": str(math.ceil(time.time() + self._ttl))},
        }
        if (scope := scope_of(session_id, record.owner)) is not None:
            item |= {"owner_scope": {"S": scope}, "active_at": {"N": str(now_ms())}}
        if expected_version == 0:
            condition, values = "attribute_not_exists(session_id)", {}
        else:
            condition, values = "v = :expected", {":expected": {"N": str(expected_version)}}
        try:
            with _errors(f"DynamoDB write of session {session_id}"):
                self._client.put_item(
                    TableName=self._table,
                    Item=item,
                    ConditionExpression=condition,
                    **({"ExpressionAttributeValues": values} if values else {}),
                )
        except SessionStoreError as exc:
            if _too_large(exc.__cause__):
                raise SessionStateError(
                    f"the session record is {len(item['doc']['S'].encode())} bytes; "
                    f"DynamoDB refused it ({exc.__cause__}); an item holds at most 400 KB"
                ) from exc.__cause__
            if error_code(exc.__cause__) != CONDITION_FAILED:
                raise
            raise StaleSessionError(
                f"session {session_id} changed since version {expected_version}"
            ) from exc.__cause__

    def list_sessions(
        self, scope: str, limit: int, after: SessionEntry | None = None
    ) -> SessionPage:
        # The bounds are on the sort key (a filter may not name a key of the index): within the
        # TTL, and at or before the cursor's time (ties at that time are skipped by page_of).
        oldest = now_ms() - int(self._ttl * 1000)
        if after is not None and after.active_at <= oldest:
            return SessionPage([], False)  # a cursor older than any live session
        values = {":scope": {"S": scope}, ":oldest": {"N": str(oldest)}}
        condition = "owner_scope = :scope AND active_at > :oldest"
        if after is not None:
            values[":top"] = {"N": str(after.active_at)}
            condition = "owner_scope = :scope AND active_at BETWEEN :oldest AND :top"
        query: dict[str, Any] = {
            "TableName": self._table,
            "IndexName": OWNER_INDEX,
            "KeyConditionExpression": condition,
            "ExpressionAttributeValues": values,
            "ScanIndexForward": False,
        }
        entries: list[SessionEntry] = []
        with _errors(f"DynamoDB listing of the sessions of {scope}"):
            while not page_of(entries, limit, after).more:
                reply = self._client.query(**query, Limit=limit + 1)
                entries += [_entry(item) for item in reply.get("Items", [])]
                if "LastEvaluatedKey" not in reply:
                    break
                query["ExclusiveStartKey"] = reply["LastEvaluatedKey"]
        return page_of(entries, limit, after)

    def delete(self, session_id: str) -> None:
        with _errors(f"DynamoDB erase of session {session_id}"):
            self._client.delete_item(TableName=self._table, Key={"session_id": {"S": session_id}})

    def _new_turn_signals(self, stale_after: float) -> TurnSignals:
        return DynamoDBTurnSignals(self._client, self._table, stale_after=stale_after)

    def ping(self) -> None:
        """Read one key: an Agent Runner's role may read and write the table, not describe it."""
        with table_check(
            self._table,
            "session.dynamodb",
            unavailable=SessionStoreUnavailableError,
            failed=SessionStoreError,
        ):
            self._client.get_item(TableName=self._table, Key={"session_id": {"S": _PROBE}})


def _too_large(exc: BaseException | None) -> bool:
    """Whether DynamoDB refused an item for its size (400 KB), which no retry changes."""
    return error_code(exc) == "ValidationException" and "size" in str(exc).lower()


def _entry(item: dict[str, Any]) -> SessionEntry:
    return SessionEntry(item["session_id"]["S"], int(item["active_at"]["N"]))
