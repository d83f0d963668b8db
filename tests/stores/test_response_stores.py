"""Every response store passes the same contract: in memory, Redis (real), DynamoDB (moto)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import boto3
import pytest

from agentkernel.core.config.stores import ResponseStoreConfig
from agentkernel.core.errors import AKConfigError, ResponseStoreError, StoreUnavailableError
from agentkernel.pipeline.response_store import ResponseStore, create_response_store
from agentkernel.pipeline.response_store.dynamodb import DynamoDBResponseStore
from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore
from agentkernel.pipeline.response_store.redis import RedisResponseStore
from agentkernel.pipeline.response_store.testing import ResponseStoreContract
from agentkernel.pipeline.session_store.dynamodb import DynamoDBSessionStore
from agentkernel.pipeline.wire.records import ResponseRecord, index_periods
from tests import servers


class TestInMemoryResponseStore(ResponseStoreContract):
    wake_latency = 0.1

    def make_store(self, ttl: float) -> ResponseStore:
        return InMemoryResponseStore(ttl=ttl)


def test_a_busy_sessions_index_keeps_only_ids_whose_entries_live() -> None:
    """A session that never idles for ``ttl`` never expires its index, so the index forgets
    the ids whose replies expired as new ones come (memory bounded by the live replies)."""
    store = InMemoryResponseStore(ttl=1.0)
    store.put(ResponseRecord("old", "s", 200, {"result": "a"}))
    time.sleep(0.6)
    store.put(ResponseRecord("mid", "s", 200, {"result": "b"}))  # the session stays busy
    time.sleep(0.6)
    store.put(ResponseRecord("new", "s", 200, {"result": "c"}))  # "old" expired meanwhile
    assert store._session_requests("s") == ["mid", "new"]
    assert store.forget_session("s", None, []) == ["mid", "new"]


@pytest.mark.redis
class TestRedisResponseStore(ResponseStoreContract):
    wake_latency = 0.5  # a notification is milliseconds; the rest is a loaded CI machine's

    @pytest.fixture(autouse=True)
    def _server(self, redis_url: str) -> None:
        self.url = redis_url

    def make_store(self, ttl: float) -> ResponseStore:
        # a hash-tagged prefix, as a cluster needs (tests/stores/test_redis_store_servers.py)
        return RedisResponseStore(self.url, prefix=f"{{test:{uuid.uuid4().hex}}}:", ttl=ttl)


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


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


#: Three hours from period 1000 on (``INDEX_PERIOD_SECONDS``): turns "a", "b", "c" of session "s",
#: "c" written by a process whose replies live a day (another ``ttl``), the erase an hour after
#: "b", with a ``ttl`` of an hour, so "a" (two hours back) is past it.
HOURS = ((3_600_000.0, "a"), (3_603_700.0, "b"), (3_607_500.0, "c"))


@pytest.mark.aws
def test_a_busy_dynamodb_session_indexes_its_turns_per_period(
    aws: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One index item per hour: a session busy for days never grows one item towards
    DynamoDB's 400 KB limit; an erase still finds every turn whose entries live, those a process
    with another ``ttl`` indexed, and those an earlier version indexed in its single item."""
    table = f"responses-{uuid.uuid4().hex[:8]}"
    create_table(table, "request_id")
    clock = _Clock(HOURS[0][0])
    monkeypatch.setattr("agentkernel.pipeline.response_store.dynamodb.time.time", clock)
    store = DynamoDBResponseStore(table, ttl=3600.0)
    other = DynamoDBResponseStore(table, ttl=86400.0)
    dynamodb = boto3.client("dynamodb")
    dynamodb.put_item(  # a reply an earlier version wrote, indexed in its single item
        TableName=table,
        Item={
            "request_id": {"S": "legacy"},
            "session_id": {"S": "s"},
            "status_code": {"N": "200"},
            "body": {"S": "{}"},
            "expiry_time": {"N": "3700000"},
        },
    )
    dynamodb.update_item(
        TableName=table,
        Key={"request_id": {"S": "#turns#s"}},
        UpdateExpression="ADD turns :id",
        ExpressionAttributeValues={":id": {"SS": ["legacy"]}},
    )
    for at, request_id in HOURS:
        clock.now = at
        writer = other if request_id == "c" else store
        writer.put(ResponseRecord(request_id, "s", 200, {"result": request_id}))

    def indexed(period: int) -> list[str]:
        item = dynamodb.get_item(TableName=table, Key={"request_id": {"S": f"#turns#s#{period}"}})
        return sorted(item.get("Item", {}).get("turns", {}).get("SS", []))

    assert (indexed(1000), indexed(1001), indexed(1002)) == (["a"], ["b"], ["c"])
    # "a" was indexed more than a ttl ago: its reply expired, and the erase no longer reads it
    assert store.forget_session("s", None, []) == ["b", "c", "legacy"]
    assert indexed(1001) == indexed(1002) == []
    assert "Item" not in dynamodb.get_item(TableName=table, Key={"request_id": {"S": "#turns#s"}})


def test_factory_requires_the_dynamodb_table_name() -> None:
    with pytest.raises(AKConfigError, match=r"response_store\.dynamodb\.table_name"):
        create_response_store(ResponseStoreConfig(type="dynamodb"))


def test_factory_rejects_unknown_types() -> None:
    with pytest.raises(ValueError, match="unknown response store 'cassandra'"):
        ResponseStoreConfig(type="cassandra")  # refused when the configuration loads


def test_factory_builds_redis(redis_url: str) -> None:
    config = ResponseStoreConfig.model_validate({"type": "redis", "redis": {"url": redis_url}})
    assert isinstance(create_response_store(config), RedisResponseStore)


# -- outages: every client exception is mapped, and an unreachable store fails fast -----------


def closed_port() -> int:
    return servers.free_port()


def calls(store: ResponseStore) -> dict[str, Callable[[], object]]:
    record = ResponseRecord(uuid.uuid4().hex, "s", 200, {"result": "x"})
    return {
        "put": lambda: store.put(record),
        "get": lambda: store.get(record.request_id),
        "ping": store.ping,
        "wait": lambda: asyncio.run(store.wait(record.request_id, 5)),
    }


@pytest.mark.parametrize("operation", ["put", "get", "ping", "wait"])
def test_unreachable_redis_is_store_unavailable_quickly(operation: str) -> None:
    store = RedisResponseStore(f"redis://127.0.0.1:{closed_port()}/0")
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught:
        calls(store)[operation]()
    assert time.monotonic() - started < 2.0
    assert caught.value.__cause__ is not None  # chained, not swallowed
    store.close()


def test_unreadable_redis_record_is_a_store_error(redis_url: str) -> None:
    import redis

    prefix = f"test:{uuid.uuid4().hex}:"
    redis.Redis.from_url(redis_url).set(f"{prefix}resp:r1", b"\xff not json")
    store = RedisResponseStore(redis_url, prefix=prefix)
    with pytest.raises(ResponseStoreError) as caught:
        store.get("r1")
    assert not isinstance(caught.value, StoreUnavailableError)
    store.close()


@pytest.mark.redis
def test_a_busy_redis_session_indexes_its_turns_per_period(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on DynamoDB: one set per hour, each expiring with its entries, and an erase that finds
    every live turn, those of a process with another ``ttl`` and those an earlier version's
    single set names."""
    import redis

    prefix = f"test:{uuid.uuid4().hex}:"
    client = redis.Redis.from_url(redis_url)
    store = RedisResponseStore(redis_url, prefix=prefix, ttl=3600.0)
    other = RedisResponseStore(redis_url, prefix=prefix, ttl=86400.0)
    client.set(f"{prefix}resp:legacy", ResponseRecord("legacy", "s", 200, {}).to_json())
    client.sadd(f"{prefix}turns:s", "legacy")  # what an earlier version wrote
    clock = _Clock(HOURS[0][0])
    monkeypatch.setattr("agentkernel.pipeline.response_store.base.time.time", clock)
    for at, request_id in HOURS:
        clock.now = at
        writer = other if request_id == "c" else store
        writer.put(ResponseRecord(request_id, "s", 200, {"result": request_id}))

    def indexed(period: int) -> list[str]:
        return sorted(m.decode() for m in client.smembers(f"{prefix}turns:s#{period}"))

    assert (indexed(1000), indexed(1001), indexed(1002)) == (["a"], ["b"], ["c"])
    assert 0 < client.pttl(f"{prefix}turns:s#1001") <= 3_600_000  # expires with its entries
    # "a" was indexed more than a ttl ago: its reply expired, and the erase no longer reads it
    assert store.forget_session("s", None, []) == ["b", "c", "legacy"]
    assert not client.exists(f"{prefix}turns:s#1001", f"{prefix}turns:s#1002", f"{prefix}turns:s")
    store.close()
    other.close()


def test_an_erase_reads_the_index_periods_its_ttl_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agentkernel.pipeline.response_store.base.time.time", _Clock(3_601_800.0))
    assert list(index_periods(3600.0)) == [999, 1000, 1001]
    assert list(index_periods(60.0)) == [999, 1000, 1001]  # the last minute may be the last hour
    assert list(index_periods(86400.0)) == list(range(976, 1002))  # a day back, an hour ahead


def test_bad_redis_url_is_a_config_error() -> None:
    with pytest.raises(AKConfigError, match=r"response_store\.redis\.url") as caught:
        RedisResponseStore("http://user:secret@example.invalid/0")
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize("operation", ["put", "get", "ping"])
def test_unreachable_dynamodb_is_store_unavailable(
    operation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in servers.aws_env("http://127.0.0.1:1").items():
        monkeypatch.setenv(key, value)
    store = DynamoDBResponseStore(
        "replies", endpoint_url=f"http://127.0.0.1:{closed_port()}", region_name="eu-west-1"
    )
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        calls(store)[operation]()
    assert time.monotonic() - started < 10.0
    store.close()


@pytest.mark.aws
def test_missing_dynamodb_table_is_a_config_error_not_an_outage(aws: str) -> None:
    name = f"missing-{uuid.uuid4().hex[:8]}"
    store = DynamoDBResponseStore(name)
    with pytest.raises(AKConfigError, match=f"table_name: DynamoDB table '{name}' does not exist"):
        store.ping()  # what start-up checks: retrying cannot make the table appear
    session_store = DynamoDBSessionStore(name)
    with pytest.raises(AKConfigError, match=f"session.dynamodb.table_name: .*'{name}'"):
        session_store.ping()
    store.close()


def test_a_redis_waiter_gets_its_reply_after_the_subscription_died(redis_url: str) -> None:
    """Seen in the chaos suite: after Redis restarted, the listener thread was gone and a reply
    stored before a new one subscribed woke nobody; the caller waited out its whole timeout."""
    import asyncio
    import time

    from agentkernel.pipeline.wire.records import ResponseRecord

    prefix = f"t:{uuid.uuid4().hex}:"
    waiting, writer = RedisResponseStore(redis_url, prefix), RedisResponseStore(redis_url, prefix)
    record = ResponseRecord(uuid.uuid4().hex, "s", 200, {"result": "late"})

    async def scenario() -> float:
        task = asyncio.create_task(waiting.wait(record.request_id, 20))
        await asyncio.sleep(0.3)
        waiting._pubsub.close()  # the subscription dies, as when Redis restarts
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await asyncio.to_thread(writer.put, record)
        assert await task == record
        return time.monotonic() - started

    try:
        assert asyncio.run(scenario()) < 3
    finally:
        waiting.close()
        writer.close()


class _CountingRedisStore(RedisResponseStore):
    """Counts the reads of reply keys, to tell a reply carried by its notification."""

    reads = 0

    def get(self, request_id: str) -> ResponseRecord | None:
        self.reads += 1
        return super().get(request_id)


@pytest.mark.parametrize(("size", "reads"), [(100, 0), (100_000, 1)])
def test_a_redis_watch_reads_the_key_only_for_a_reply_too_large_to_announce(
    redis_url: str, size: int, reads: int
) -> None:
    """A reply up to NOTIFY_PAYLOAD_BYTES travels with its notification: the waiting request
    reads nothing (the key was read three times per sync turn before); a larger one is read."""
    prefix = f"t:{uuid.uuid4().hex}:"
    store = _CountingRedisStore(redis_url, prefix)
    record = ResponseRecord(uuid.uuid4().hex, "s", 200, {"result": "x" * size})

    async def scenario() -> ResponseRecord | None:
        async with store.watch(uuid.uuid4().hex) as first:  # starts the subscription
            await first.result(0.05)
        store.reads = 0
        async with store.watch(record.request_id) as watch:
            await asyncio.to_thread(store.put, record)
            return await watch.result(5)

    try:
        assert asyncio.run(scenario()) == record
        assert store.reads == reads
    finally:
        store.close()


def test_a_notification_is_a_reply_only_when_it_reads_as_one() -> None:
    from agentkernel.pipeline.response_store.watch import announced_record

    record = ResponseRecord(uuid.uuid4().hex, "s", 200, {"result": "ok"}, "alice")
    assert announced_record(record.to_json().encode()) == record
    assert announced_record(record.to_json()) == record
    for bare in (None, b"1", "1", b"", b'{"request_id": "x"}', b"{not json", 1):
        assert announced_record(bare) is None
