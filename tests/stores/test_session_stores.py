"""Every session store passes the same contract: in memory, Redis (real), DynamoDB (moto)."""

from __future__ import annotations

import time
import uuid

import boto3
import pytest

from agentkernel.core.config.stores import SessionConfig
from agentkernel.core.errors import (
    AKConfigError,
    SessionStoreError,
    SessionStoreUnavailableError,
    StoreUnavailableError,
)
from agentkernel.pipeline.session_store import SessionStore, create_session_store
from agentkernel.pipeline.session_store.base import SessionRecord
from agentkernel.pipeline.session_store.dynamodb import OWNER_INDEX, DynamoDBSessionStore
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.session_store.redis import RedisSessionStore
from agentkernel.pipeline.session_store.testing import SessionStoreContract


def create_session_table(name: str) -> None:
    """A session table as the deployment templates declare it: with the owner index."""
    string, number = "S", "N"
    boto3.client("dynamodb").create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "session_id", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": "session_id", "AttributeType": string},
            {"AttributeName": "owner_scope", "AttributeType": string},
            {"AttributeName": "active_at", "AttributeType": number},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": OWNER_INDEX,
                "KeySchema": [
                    {"AttributeName": "owner_scope", "KeyType": "HASH"},
                    {"AttributeName": "active_at", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )


class TestInMemorySessions(SessionStoreContract):
    def make_store(self, ttl: float = 60) -> SessionStore:
        return InMemorySessionStore(ttl=ttl)


@pytest.mark.redis
class TestRedisSessions(SessionStoreContract):
    @pytest.fixture(autouse=True)
    def _server(self, redis_url: str) -> None:
        self.url = redis_url

    def make_store(self, ttl: float = 60) -> SessionStore:
        # a hash-tagged prefix, as a cluster needs (tests/stores/test_redis_store_servers.py)
        return RedisSessionStore(self.url, prefix=f"{{t:{uuid.uuid4().hex}}}:", ttl=ttl)


@pytest.mark.aws
class TestDynamoDBSessions(SessionStoreContract):
    @pytest.fixture(autouse=True)
    def _server(self, aws: str) -> None:
        self.table = f"sessions-{uuid.uuid4().hex[:8]}"
        create_session_table(self.table)

    def make_store(self, ttl: float = 60) -> SessionStore:
        return DynamoDBSessionStore(self.table, ttl=ttl)


def test_factory_errors_name_the_key() -> None:
    with pytest.raises(AKConfigError, match=r"session\.dynamodb\.table_name"):
        create_session_store(SessionConfig(type="dynamodb"))
    with pytest.raises(AKConfigError, match=r"session\.redis"):
        create_session_store(SessionConfig(type="redis"))
    with pytest.raises(ValueError, match="unknown session store 'mongo'"):
        SessionConfig(type="mongo")  # refused when the configuration loads, before any store


def test_in_memory_store_forgets_expired_sessions() -> None:
    store = InMemorySessionStore(ttl=0.2)
    for i in range(100):
        store.save(f"old-{i}", {"i": i})
    time.sleep(0.3)
    store.save("new", {"n": 1})
    assert len(store) == 1
    assert store.load("new") == {"n": 1}


def test_unreachable_redis_raises_session_store_errors() -> None:
    store = RedisSessionStore("redis://127.0.0.1:1/0")
    with pytest.raises(SessionStoreError, match="session s"):
        store.read("s")
    with pytest.raises(SessionStoreError):
        store.ping()


@pytest.mark.parametrize(
    ("code", "status", "unavailable"),
    [
        ("ThrottlingException", 400, True),
        ("ProvisionedThroughputExceededException", 400, True),
        ("InternalServerError", 500, True),
        ("ValidationException", 400, False),
    ],
)
def test_dynamodb_session_errors_are_classified_as_the_response_stores_are(
    code: str, status: int, unavailable: bool
) -> None:
    """Throttling and server errors are outages to wait out, for sessions as for replies."""
    from botocore.exceptions import ClientError

    from agentkernel.pipeline.session_store.dynamodb import _errors

    error = ClientError(
        {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetItem"
    )
    with pytest.raises(SessionStoreError) as caught, _errors("read"):
        raise error
    assert isinstance(caught.value, SessionStoreUnavailableError) is unavailable


def test_unreachable_redis_is_an_outage_worth_waiting_out() -> None:
    """The consumer loop retries a message in place, keeping its deliveries, on this error."""
    store = RedisSessionStore("redis://127.0.0.1:1/0")
    with pytest.raises(SessionStoreUnavailableError) as read:
        store.read("s")
    assert isinstance(read.value, StoreUnavailableError)
    with pytest.raises(SessionStoreUnavailableError):
        store.write("s", SessionRecord(), expected_version=0)


def no_aws_region(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")


def test_dynamodb_session_store_without_a_region_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It used to raise botocore's NoRegionError, a client exception out of the backend."""
    no_aws_region(monkeypatch)
    with pytest.raises(AKConfigError, match=r"session\.dynamodb\.region_name") as caught:
        DynamoDBSessionStore("sessions")
    assert caught.value.__cause__ is not None


def test_bad_redis_session_url_is_a_config_error() -> None:
    """It used to raise redis-py's ValueError out of the backend."""
    with pytest.raises(AKConfigError, match=r"session\.redis\.url") as caught:
        RedisSessionStore("http://user:secret@example.invalid/0")
    assert "secret" not in str(caught.value)
