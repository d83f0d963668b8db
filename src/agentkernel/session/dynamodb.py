"""Session state in DynamoDB: partition key ``session_id``, ``state`` (JSON), ``expiry_time``."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from agentkernel.core.errors import ResponseStoreError
from agentkernel.session.base import SessionStore

_ERRORS = (BotoCoreError, ClientError)


class DynamoDBSessionStore(SessionStore):
    """Args: table_name; ttl: seconds state lives after a save; region_name; endpoint_url."""

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

    def load(self, session_id: str) -> dict[str, Any]:
        try:
            item = self._client.get_item(
                TableName=self._table, Key={"session_id": {"S": session_id}}, ConsistentRead=True
            ).get("Item")
        except _ERRORS as exc:
            raise ResponseStoreError(f"DynamoDB read of session {session_id}: {exc}") from exc
        if item is None or float(item["expiry_time"]["N"]) <= time.time():
            return {}
        return dict(json.loads(item["state"]["S"]))

    def save(self, session_id: str, state: dict[str, Any]) -> None:
        item = {
            "session_id": {"S": session_id},
            "state": {"S": json.dumps(state)},
            "expiry_time": {"N": str(math.ceil(time.time() + self._ttl))},
        }
        try:
            self._client.put_item(TableName=self._table, Item=item)
        except _ERRORS as exc:
            raise ResponseStoreError(f"DynamoDB write of session {session_id}: {exc}") from exc

    def ping(self) -> None:
        self._client.describe_table(TableName=self._table)
