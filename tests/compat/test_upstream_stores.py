"""Replies written by upstream agentkernel 0.9.5, read here during a migration.

Upstream keeps a reply as JSON at ``<prefix><request_id>`` in Redis (default prefix
``ak:responses:``) and as an item with a map ``body`` in DynamoDB (``expiry_time`` only when its
TTL is set). The records below are written the way upstream's stores write them, against a real
Redis and moto's DynamoDB, and read back through this package's stores and HTTP front.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import boto3
import pytest

from agentkernel.core.config import AKConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.pipeline.response_store import ResponseStore, create_response_store
from agentkernel.pipeline.response_store.dynamodb import DynamoDBResponseStore
from agentkernel.pipeline.response_store.redis import RedisResponseStore
from agentkernel.pipeline.response_store.testing import ResponseStoreContract
from agentkernel.pipeline.wire.records import ResponseRecord
from tests.api.conftest import Server, make_config, registry
from tests.stores.test_response_stores import create_table

# -- Redis ------------------------------------------------------------------------------------


def upstream_redis_put(url: str, prefix: str, record: dict[str, Any], ttl: int = 60) -> None:
    """What upstream's RedisResponseStore.add_message does: SET <prefix><id> <json> EX <ttl>."""
    import redis

    client = redis.Redis.from_url(url, decode_responses=True)
    client.set(f"{prefix}{record['request_id']}", json.dumps(record), ex=ttl)
    client.close()


def upstream_record(session: str, status: int = 200, **body: Any) -> dict[str, Any]:
    request_id = str(uuid.uuid4())
    reply = {"result": "from upstream", "session_id": session, **body}
    return {"session_id": session, "request_id": request_id, "status_code": status, "body": reply}


@pytest.fixture
def prefixes() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"own-{tag}:", f"up-{tag}:responses:"


@pytest.mark.redis
def test_redis_reads_a_reply_upstream_wrote(redis_url: str, prefixes: tuple[str, str]) -> None:
    ours, theirs = prefixes
    record = upstream_record("s1", extra=[1, "two"])
    upstream_redis_put(redis_url, theirs, record)
    store = RedisResponseStore(redis_url, prefix=ours, upstream_prefix=theirs)
    plain = RedisResponseStore(redis_url, prefix=ours)
    try:
        got = store.get(record["request_id"])
        assert got == ResponseRecord(record["request_id"], "s1", 200, record["body"], owner=None)
        assert plain.get(record["request_id"]) is None  # off unless configured
        store.put(ResponseRecord(record["request_id"], "s1", 200, {"result": "ours"}))
        assert store.get(record["request_id"]).body == {"result": "ours"}  # type: ignore[union-attr]
    finally:
        store.close()
        plain.close()


@pytest.mark.redis
def test_a_waiting_request_sees_an_upstream_reply_without_a_notification(
    redis_url: str, prefixes: tuple[str, str]
) -> None:
    """Upstream's writer publishes nothing: the waiter's periodic re-read finds the key."""
    ours, theirs = prefixes
    record = upstream_record("s2")
    store = RedisResponseStore(redis_url, prefix=ours, upstream_prefix=theirs)
    writer = threading.Timer(0.3, upstream_redis_put, (redis_url, theirs, record))
    writer.start()
    try:
        started = time.monotonic()
        got = asyncio.run(store.wait(record["request_id"], 5.0))
        assert got is not None and got.body["result"] == "from upstream"
        assert time.monotonic() - started < 2.5
    finally:
        writer.join()
        store.close()


@pytest.mark.redis
def test_the_upstream_prefix_is_a_config_key(redis_url: str, prefixes: tuple[str, str]) -> None:
    ours, theirs = prefixes
    record = upstream_record("s3")
    upstream_redis_put(redis_url, theirs, record)
    redis_block = {"url": redis_url, "prefix": ours, "upstream_prefix": theirs}
    config = AKConfig(execution={"response_store": {"type": "redis", "redis": redis_block}})
    store = create_response_store(config.execution.response_store)
    try:
        assert store.get(record["request_id"]) is not None
    finally:
        store.close()
    for bad in ("", 5):
        with pytest.raises((AKConfigError, ValueError)):
            AKConfig(
                execution={"response_store": {"type": "redis", "redis": {"upstream_prefix": bad}}}
            )


@pytest.mark.redis
def test_an_upstream_reply_is_polled_over_http_under_its_session_only(
    redis_url: str, prefixes: tuple[str, str]
) -> None:
    ours, theirs = prefixes
    done, failed = upstream_record("mig"), upstream_record("mig", status=500, error="AGENT_ERROR")
    for record in (done, failed):
        upstream_redis_put(redis_url, theirs, record)
    store = RedisResponseStore(redis_url, prefix=ours, upstream_prefix=theirs)
    server = Server(IOHandler(make_config(), registry=registry(), store=store, with_runner=True))
    try:
        for record, status in ((done, 200), (failed, 500)):
            query = {"request_id": record["request_id"]}
            got = server.client.get("/api/v1/chat/mig", params=query)
            assert got.status_code == status and got.json()["result"] == "from upstream"
            same = server.client.get("/api/v1/chat", params=query | {"session_id": "mig"})
            assert same.json() == got.json()
            other = server.client.get("/api/v1/chat/other", params=query)
            assert (other.status_code, other.json()["error"]) == (404, "NOT_FOUND")
    finally:
        server.close()
        store.close()


@pytest.mark.redis
class TestRedisStoreReadingUpstreamKeys(ResponseStoreContract):
    """Reading upstream's keys as well changes nothing for this package's own records."""

    wake_latency = 0.5  # a notification is milliseconds; the rest is a loaded CI machine's

    @pytest.fixture(autouse=True)
    def _server(self, redis_url: str) -> None:
        self.url = redis_url

    def make_store(self, ttl: float) -> ResponseStore:
        tag = uuid.uuid4().hex
        return RedisResponseStore(
            self.url, prefix=f"test:{tag}:", ttl=ttl, upstream_prefix=f"up:{tag}:"
        )


# -- DynamoDB ---------------------------------------------------------------------------------


@pytest.fixture
def table(aws: str) -> Iterator[str]:
    name = f"responses-{uuid.uuid4().hex[:8]}"
    create_table(name, "request_id")
    yield name


def upstream_dynamodb_put(table: str, record: dict[str, Any], ttl: int = 0) -> None:
    """What upstream's DynamoDBResponseStore.add_message does: the boto3 resource's put_item of
    the record, ``expiry_time`` added only when its TTL is above 0."""
    item = dict(record)
    if ttl > 0:
        item["expiry_time"] = int(time.time()) + ttl
    boto3.resource("dynamodb").Table(table).put_item(Item=item)


@pytest.mark.aws
def test_dynamodb_reads_an_item_upstream_wrote(table: str) -> None:
    nested = {"list": [1, "a", True, None], "ratio": Decimal("1.5"), "count": Decimal(3)}
    record = upstream_record("d1", nested=nested)
    upstream_dynamodb_put(table, record, ttl=60)
    store = DynamoDBResponseStore(table)
    try:
        got = store.get(record["request_id"])
        assert got is not None and (got.session_id, got.status_code, got.owner) == ("d1", 200, None)
        assert got.body["nested"] == {"list": [1, "a", True, None], "ratio": 1.5, "count": 3}
        assert isinstance(got.body["nested"]["count"], int)
        assert json.loads(json.dumps(got.body)) == got.body  # plain JSON values
    finally:
        store.close()


@pytest.mark.aws
def test_dynamodb_honours_upstreams_expiry_and_its_absence(table: str) -> None:
    forever, expired = upstream_record("d2"), upstream_record("d2")
    upstream_dynamodb_put(table, forever)  # upstream TTL 0: no expiry_time
    upstream_dynamodb_put(table, expired | {"expiry_time": int(time.time()) - 5})
    store = DynamoDBResponseStore(table)
    try:
        assert store.get(forever["request_id"]) is not None
        assert store.get(expired["request_id"]) is None
        ours = ResponseRecord(str(uuid.uuid4()), "d2", 200, {"result": "ours"}, owner="key:a")
        store.put(ours)
        assert store.get(ours.request_id) == ours
    finally:
        store.close()


@pytest.mark.aws
def test_an_upstream_dynamodb_reply_is_polled_over_http(table: str) -> None:
    record = upstream_record("dd", status=504, error="TIMEOUT")
    upstream_dynamodb_put(table, record, ttl=60)
    store = DynamoDBResponseStore(table)
    server = Server(IOHandler(make_config(), registry=registry(), store=store, with_runner=True))
    try:
        query = {"request_id": record["request_id"], "session_id": "dd"}
        got = server.client.get("/api/v1/chat", params=query)
        assert got.status_code == 504 and got.json()["error"] == "TIMEOUT"
    finally:
        server.close()
        store.close()
