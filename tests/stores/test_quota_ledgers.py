"""Every quota ledger passes the same contract: in memory, Redis (real), DynamoDB (moto); the
shared ones also survive losing their counts and fail alike when their server is away."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest

from agentkernel.core.config.limits import LimitsConfig
from agentkernel.core.errors import AKConfigError, ResponseStoreError, StoreUnavailableError
from agentkernel.core.redis_client import redis_client
from agentkernel.pipeline.front.quota import IdentityQuota
from agentkernel.pipeline.quota import Quota, QuotaLedger
from agentkernel.pipeline.quota.dynamodb import BUCKETS, DynamoDBQuotaLedger
from agentkernel.pipeline.quota.redis import RedisQuotaLedger
from agentkernel.pipeline.quota.testing import TURNS, QuotaLedgerContract
from agentkernel.pipeline.response_store import ResponseStore
from agentkernel.pipeline.response_store.dynamodb import DynamoDBResponseStore
from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore
from agentkernel.pipeline.response_store.redis import RedisResponseStore
from tests import servers

from .test_response_stores import closed_port, create_table


class TestInMemoryLedger(QuotaLedgerContract):
    def make_ledgers(self, ttl: float) -> tuple[QuotaLedger, QuotaLedger]:
        ledger = InMemoryResponseStore(ttl=ttl).quota_ledger()
        return ledger, ledger  # one process: both fronts use the store's one ledger


class SharedLedgerCases:
    """Cases of a ledger whose counts live on a server: lost counts start afresh."""

    def ledger(self, ttl: float = 60.0) -> QuotaLedger:
        raise NotImplementedError

    def forget(self, ledger: QuotaLedger, owner: str) -> None:
        """Lose everything the server holds for ``owner`` (expiry, eviction, an operator)."""
        raise NotImplementedError

    def test_counts_lost_on_the_server_start_afresh(self) -> None:
        ledger, owner = self.ledger(), f"key:{uuid.uuid4().hex[:8]}"
        counted = [uuid.uuid4().hex for _ in range(3)]
        for request_id in counted:
            ledger.admit(owner, request_id, TURNS)
        ledger.stored(owner, "r#0", 10)
        self.forget(ledger, owner)
        ledger.read(owner, counted[0])  # a reply read after its count was lost
        ledger.stored(owner, "r#1", 10)
        assert [ledger.admit(owner, uuid.uuid4().hex, TURNS) for _ in range(3)] == [None] * 3
        assert ledger.admit(owner, uuid.uuid4().hex, TURNS) is not None


@pytest.mark.redis
class TestRedisLedger(QuotaLedgerContract, SharedLedgerCases):
    @pytest.fixture(autouse=True)
    def _server(self, redis_url: str) -> None:
        # a hash-tagged prefix and any client, so the suite also runs on a cluster
        self.url, self.prefix = redis_url, f"{{tq:{uuid.uuid4().hex}}}:"

    def make_ledgers(self, ttl: float) -> tuple[QuotaLedger, QuotaLedger]:
        return tuple(  # type: ignore[return-value]
            RedisResponseStore(self.url, prefix=self.prefix, ttl=ttl).quota_ledger()
            for _ in range(2)
        )

    def ledger(self, ttl: float = 60.0) -> QuotaLedger:
        return self.make_ledgers(ttl)[0]

    def forget(self, ledger: QuotaLedger, owner: str) -> None:
        client = redis_client(self.url)
        client.delete(*client.scan_iter(match=f"{self.prefix}quota:{owner}:*"))


@pytest.mark.aws
class TestDynamoDBLedger(QuotaLedgerContract, SharedLedgerCases):
    bytes_grace = 1.0 / BUCKETS  # one bucket

    @pytest.fixture(autouse=True)
    def _server(self, aws: str) -> None:
        self.table = f"quota-{uuid.uuid4().hex[:8]}"
        create_table(self.table, "request_id")

    def make_ledgers(self, ttl: float) -> tuple[QuotaLedger, QuotaLedger]:
        # two stores, two boto3 clients: two fronts in two containers
        return tuple(  # type: ignore[return-value]
            DynamoDBResponseStore(self.table, ttl=ttl).quota_ledger() for _ in range(2)
        )

    def ledger(self, ttl: float = 60.0) -> QuotaLedger:
        return self.make_ledgers(ttl)[0]

    def forget(self, ledger: QuotaLedger, owner: str) -> None:
        client = boto3.client("dynamodb")
        items = client.scan(TableName=self.table)["Items"]
        quota = [i for i in items if i["request_id"]["S"].startswith("#quota#")]
        assert len(quota) == 1
        client.delete_item(TableName=self.table, Key={"request_id": quota[0]["request_id"]})

    def test_the_counts_live_in_one_item_with_a_ttl(self) -> None:
        ledger, owner = self.ledger(), "key:alice"
        for request_id in [uuid.uuid4().hex for _ in range(3)]:
            ledger.admit(owner, request_id, TURNS)
        for index in range(40):
            ledger.stored(owner, f"r#{index}", 10)
        items = boto3.client("dynamodb").scan(TableName=self.table)["Items"]
        assert len(items) == 1
        (item,) = items
        assert "alice" not in item["request_id"]["S"]  # keyed by a digest of the identity
        assert float(item["expiry_time"]["N"]) > 60
        assert len(item["unread"]["M"]) == 3
        assert sum(int(v["N"]) for k, v in item.items() if k.startswith("qb")) == 400

    def test_expired_entries_are_removed_when_they_fill_the_map(self) -> None:
        ledger, owner = self.ledger(ttl=1.0), "key:bob"
        for request_id in [uuid.uuid4().hex for _ in range(3)]:
            ledger.admit(owner, request_id, TURNS)
        time.sleep(1.2)
        fresh = uuid.uuid4().hex
        assert ledger.admit(owner, fresh, TURNS) is None
        (item,) = boto3.client("dynamodb").scan(TableName=self.table)["Items"]
        assert list(item["unread"]["M"]) == [fresh]

    def test_the_byte_ring_never_grows(self) -> None:
        ledger, owner = self.ledger(ttl=0.6), "key:carol"
        for index in range(40):  # ~2.4 TTLs of writes, one every 60 ms
            ledger.stored(owner, f"r#{index}", 1)
            time.sleep(0.06)
        (item,) = boto3.client("dynamodb").scan(TableName=self.table)["Items"]
        assert len([k for k in item if k.startswith("qi")]) <= BUCKETS + 1

    def test_a_missing_table_is_a_store_error_not_an_outage(self) -> None:
        ledger = DynamoDBResponseStore(f"missing-{uuid.uuid4().hex[:8]}").quota_ledger()
        with pytest.raises(ResponseStoreError) as caught:
            ledger.admit("key:a", "r1", TURNS)
        assert not isinstance(caught.value, StoreUnavailableError)

    def test_a_cap_over_what_one_item_holds_is_refused_at_start(self) -> None:
        store = DynamoDBResponseStore(self.table)
        bound = DynamoDBQuotaLedger.max_unread_turns
        assert bound is not None
        IdentityQuota(store, LimitsConfig(identity_unread_turns=bound))
        with pytest.raises(AKConfigError, match="identity_unread_turns"):
            IdentityQuota(store, LimitsConfig(identity_unread_turns=bound + 1))


# -- a shared ledger whose server is away fails alike: unavailable, and the turn goes on --------


def unreachable_redis() -> ResponseStore:
    return RedisResponseStore(f"redis://127.0.0.1:{closed_port()}/0")


def unreachable_dynamodb() -> ResponseStore:
    return DynamoDBResponseStore(
        "replies", endpoint_url=f"http://127.0.0.1:{closed_port()}", region_name="eu-west-1"
    )


UNREACHABLE: dict[str, Callable[[], ResponseStore]] = {
    "redis": unreachable_redis,
    "dynamodb": unreachable_dynamodb,
}
CALLS: dict[str, Callable[[QuotaLedger], object]] = {
    "admit": lambda ledger: ledger.admit("key:a", "r1", TURNS),
    "read": lambda ledger: ledger.read("key:a", "r1"),
    "stored": lambda ledger: ledger.stored("key:a", "r1", 10),
}


@pytest.fixture
def _fake_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in servers.aws_env("http://127.0.0.1:1").items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def throttling_dynamodb(_fake_aws_credentials: None) -> Iterator[str]:
    """A DynamoDB endpoint that throttles every call, as AWS answers a hot partition."""
    calls: list[str] = []

    class Throttle(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            calls.append(self.headers.get("x-amz-target", ""))
            body = b'{"__type": "com.amazonaws.dynamodb.v20120810#ThrottlingException", '
            body += b'"message": "Rate of requests exceeds the allowed throughput."}'
            self.send_response(400)
            self.send_header("content-type", "application/x-amz-json-1.0")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Throttle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    assert calls, "the endpoint was never called"


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_throttled_dynamodb_ledger_is_store_unavailable(
    throttling_dynamodb: str, call: str
) -> None:
    store = DynamoDBResponseStore("replies", endpoint_url=throttling_dynamodb)
    with pytest.raises(StoreUnavailableError, match="ThrottlingException"):
        CALLS[call](store.quota_ledger())


def test_a_throttled_ledger_lets_the_turn_through(
    throttling_dynamodb: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = DynamoDBResponseStore("replies", endpoint_url=throttling_dynamodb)
    quota = IdentityQuota(store, LimitsConfig(identity_unread_turns=1))
    with caplog.at_level(logging.WARNING, logger="agentkernel.pipeline.front.quota"):
        quota.admit("key:a", "r1", "s1")
    assert "not counted" in caplog.text


@pytest.mark.usefixtures("_fake_aws_credentials")
@pytest.mark.parametrize("backend", sorted(UNREACHABLE))
@pytest.mark.parametrize("call", sorted(CALLS))
def test_an_unreachable_ledger_is_store_unavailable(backend: str, call: str) -> None:
    ledger = UNREACHABLE[backend]().quota_ledger()
    assert isinstance(ledger, (RedisQuotaLedger, DynamoDBQuotaLedger))
    with pytest.raises(StoreUnavailableError) as caught:
        CALLS[call](ledger)
    assert caught.value.__cause__ is not None


@pytest.mark.usefixtures("_fake_aws_credentials")
@pytest.mark.parametrize("backend", sorted(UNREACHABLE))
def test_an_unreachable_ledger_lets_the_turn_through_and_says_so(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    quota = IdentityQuota(UNREACHABLE[backend](), LimitsConfig(identity_unread_turns=1))
    with caplog.at_level(logging.WARNING, logger="agentkernel.pipeline.front.quota"):
        quota.admit("key:a", "r1", "s1")
        quota.admit("key:a", "r2", "s1")  # over the cap, but nothing could be counted
    assert "not counted" in caplog.text
    assert quota.quota == Quota(1, LimitsConfig().identity_reply_bytes)
