"""Every response store passes the same contract: in memory, Redis (real), DynamoDB (moto)."""

from __future__ import annotations

import uuid

import boto3
import pytest

from agentkernel.core.config import ResponseStoreConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.pipeline.response_store import ResponseStore, create_response_store
from agentkernel.pipeline.response_store.dynamodb import DynamoDBResponseStore
from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore
from agentkernel.pipeline.response_store.redis import RedisResponseStore
from agentkernel.pipeline.response_store.testing import ResponseStoreContract


class TestInMemoryResponseStore(ResponseStoreContract):
    wake_latency = 0.1

    def make_store(self, ttl: float) -> ResponseStore:
        return InMemoryResponseStore(ttl=ttl)


@pytest.mark.redis
class TestRedisResponseStore(ResponseStoreContract):
    wake_latency = 0.3

    @pytest.fixture(autouse=True)
    def _server(self, redis_url: str) -> None:
        self.url = redis_url

    def make_store(self, ttl: float) -> ResponseStore:
        return RedisResponseStore(self.url, prefix=f"test:{uuid.uuid4().hex}:", ttl=ttl)


def create_table(name: str, key: str) -> None:
    boto3.client("dynamodb").create_table(
        TableName=name,
        KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


@pytest.mark.aws
class TestDynamoDBResponseStore(ResponseStoreContract):
    @pytest.fixture(autouse=True)
    def _server(self, aws: str) -> None:
        self.table = f"responses-{uuid.uuid4().hex[:8]}"
        create_table(self.table, "request_id")

    def make_store(self, ttl: float) -> ResponseStore:
        return DynamoDBResponseStore(self.table, ttl=ttl)


def test_factory_requires_the_dynamodb_table_name() -> None:
    with pytest.raises(AKConfigError, match=r"response_store\.dynamodb\.table_name"):
        create_response_store(ResponseStoreConfig(type="dynamodb"))


def test_factory_rejects_unknown_types() -> None:
    with pytest.raises(AKConfigError, match="unknown store"):
        create_response_store(ResponseStoreConfig(type="cassandra"))


def test_factory_builds_redis(redis_url: str) -> None:
    config = ResponseStoreConfig.model_validate({"type": "redis", "redis": {"url": redis_url}})
    assert isinstance(create_response_store(config), RedisResponseStore)
