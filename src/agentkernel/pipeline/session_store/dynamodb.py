"""Session records in DynamoDB: partition key ``session_id``, ``v``, ``doc`` (JSON), and the
TTL attribute ``expiry_time``. A commit is one conditional put on ``v``.
"""

from __future__ import annotations

import math
import time

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from agentkernel.core.errors import (
    SessionStoreError,
    SessionStoreUnavailableError,
    StaleSessionError,
)
from agentkernel.pipeline.response_store.dynamodb import unavailable
from agentkernel.pipeline.session_store.base import SessionRecord, SessionStore

_ERRORS = (BotoCoreError, ClientError)


class DynamoDBSessionStore(SessionStore):
    """Args: table_name; ttl: seconds a session lives after a write; region_name; endpoint_url."""

    def __init__(
        self,
        table_name: str,
        ttl: float = 604800.0,
        region_name: str | None = None,
        endpoint_url: str | None = None,
    ) -> None:
        self._table = table_name
        self._ttl = ttl
        self._client = boto3.client("dynamodb", region_name=region_name, endpoint_url=endpoint_url)

    def read(self, session_id: str) -> SessionRecord:
        try:
            item = self._client.get_item(
                TableName=self._table, Key={"session_id": {"S": session_id}}, ConsistentRead=True
            ).get("Item")
        except _ERRORS as exc:
            raise _mapped(exc, f"DynamoDB read of session {session_id}") from exc
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
            self._client.put_item(
                TableName=self._table,
                Item=item,
                ConditionExpression=condition,
                **({"ExpressionAttributeValues": values} if values else {}),
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                raise StaleSessionError(
                    f"session {session_id} changed since version {expected_version}"
                ) from exc
            raise _mapped(exc, f"DynamoDB write of session {session_id}") from exc
        except BotoCoreError as exc:
            raise _mapped(exc, f"DynamoDB write of session {session_id}") from exc

    def ping(self) -> None:
        try:
            self._client.describe_table(TableName=self._table)
        except _ERRORS as exc:
            raise _mapped(exc, "DynamoDB session table unreachable") from exc


def _mapped(exc: Exception, what: str) -> SessionStoreError:
    """Throttling, a server error or an unreachable endpoint is worth retrying (as for the
    response store); anything else is not."""
    kind = SessionStoreUnavailableError if unavailable(exc) else SessionStoreError
    return kind(f"{what}: {exc}")
