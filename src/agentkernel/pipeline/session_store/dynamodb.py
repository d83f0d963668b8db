"""Session records in DynamoDB: partition key ``session_id``, ``v``, ``doc`` (JSON), and the
TTL attribute ``expiry_time``. A commit is one conditional put on ``v``.

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

_errors = functools.partial(
    botocore_errors, unavailable=SessionStoreUnavailableError, failed=SessionStoreError
)
#: The key :meth:`DynamoDBSessionStore.ping` reads; only read, so harmless if it exists.
_PROBE = "agentkernel:ping"


class DynamoDBSessionStore(SessionStore):
    """Args: table_name; ttl: seconds a session lives after a write; region_name; endpoint_url.

    Raises:
        AKConfigError: no AWS region is configured, or a setting is invalid.
    """

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
