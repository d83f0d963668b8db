"""The Redis response and session stores' contracts on the other servers they claim: Redis 6.2
(the oldest supported), Valkey, and a Redis Cluster (``redis+cluster://``, with the hash-tagged
prefix a cluster requires; tests/redis_servers.py).

Each class is a contract suite of tests/stores with the server changed, less its expiry cases:
those wait out a TTL (2 s each) to watch Redis's own ``PX`` expiry, the same on every server
since Redis 2.6, and the session's Redis runs them; that keeps the compatibility runs short.
"""

from __future__ import annotations

import uuid

import pytest
from redis.crc import key_slot

from agentkernel.core.errors import AKConfigError
from agentkernel.pipeline.response_store.redis import RedisResponseStore
from agentkernel.pipeline.session_store.base import SessionRecord
from agentkernel.pipeline.session_store.redis import RedisSessionStore
from agentkernel.pipeline.wire.records import ResponseRecord
from tests.redis_servers import PrivateCluster
from tests.stores import test_quota_ledgers as ledgers
from tests.stores import test_response_stores as responses
from tests.stores import test_session_stores as sessions
from tests.turn_control import test_signals_redis as signals

pytestmark = pytest.mark.redis


class OtherServerResponses(responses.TestRedisResponseStore):
    """The response store contract less its expiry cases; subclasses name the server."""

    test_record_expires_after_its_ttl = None
    test_ticket_expires_after_its_ttl = None


class OtherServerSessions(sessions.TestRedisSessions):
    """The session store contract less its expiry case; subclasses name the server."""

    test_sessions_expire = None


class TestRedis62ResponseStore(OtherServerResponses):
    @pytest.fixture
    def redis_url(self, redis62_url: str) -> str:
        return redis62_url


class TestValkeyResponseStore(OtherServerResponses):
    @pytest.fixture
    def redis_url(self, valkey_url: str) -> str:
        return valkey_url


class TestRedisClusterResponseStore(OtherServerResponses):
    @pytest.fixture
    def redis_url(self, redis_cluster_url: str) -> str:
        return redis_cluster_url


class TestRedis62Sessions(OtherServerSessions):
    @pytest.fixture
    def redis_url(self, redis62_url: str) -> str:
        return redis62_url


class TestValkeySessions(OtherServerSessions):
    @pytest.fixture
    def redis_url(self, valkey_url: str) -> str:
        return valkey_url


class TestRedisClusterSessions(OtherServerSessions):
    @pytest.fixture
    def redis_url(self, redis_cluster_url: str) -> str:
        return redis_cluster_url


def test_a_store_on_a_cluster_needs_a_hash_tagged_prefix(redis_cluster_url: str) -> None:
    with pytest.raises(
        AKConfigError, match=r"session\.redis\.prefix: .* hash tag, e\.g\. '\{ak\}:'"
    ):
        RedisSessionStore(redis_cluster_url, prefix="ak:")
    with pytest.raises(AKConfigError, match=r"response_store\.redis: .*'ak:responses:'"):
        RedisResponseStore(redis_cluster_url, prefix="{ak}:", upstream_prefix="ak:responses:")
    RedisResponseStore(redis_cluster_url, prefix="{ak}:", upstream_prefix="{ak}:responses:")


# What the stores hand out on the same client and prefix, so in the same slot: the quota
# ledger and the turn signals. Their commands are old ones; the cluster is what could break them.


class TestRedisClusterLedger(ledgers.TestRedisLedger):
    @pytest.fixture
    def redis_url(self, redis_cluster_url: str) -> str:
        return redis_cluster_url


class TestRedisClusterTurnSignals(signals.TestRedisTurnSignals):
    @pytest.fixture
    def redis_url(self, redis_cluster_url: str) -> str:
        return redis_cluster_url


def test_the_stores_follow_their_slot_moved_to_another_node(
    redis_cluster: PrivateCluster,
) -> None:
    """Their pipelines run on the node of their slot (a cluster pipeline takes neither INFO,
    PUBLISH nor MGET); after a resharding moved it they ask the cluster again."""
    prefix = f"{{m:{uuid.uuid4().hex}}}:"
    responses_store = RedisResponseStore(redis_cluster.url, prefix=prefix)
    sessions_store = RedisSessionStore(redis_cluster.url, prefix=prefix)
    sessions_store.write("s", SessionRecord(version=1, state={"n": 1}), expected_version=0)
    redis_cluster.move_slot(key_slot(prefix.encode()))
    record = ResponseRecord("r1", "s", 200, {"ok": True})
    responses_store.put(record)  # a transaction on the old node: MOVED, then on the new one
    assert responses_store.read_stream("r1") == (record, [])
    responses_store.ping()  # the guard's INFO and GET, on the node of the slot
    sessions_store.ping()
    assert sessions_store.read("s").state == {"n": 1}
