"""Session stores keep one JSON state per session: in memory, Redis (real), DynamoDB (moto)."""

from __future__ import annotations

import time
import uuid

import pytest

from agentkernel.core.config import SessionConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.session import SessionStore, create_session_store
from agentkernel.session.dynamodb import DynamoDBSessionStore
from agentkernel.session.in_memory import InMemorySessionStore
from agentkernel.session.redis import RedisSessionStore

from .test_response_stores import create_table


class SessionStoreCases:
    def make(self, ttl: float = 60) -> SessionStore:
        raise NotImplementedError

    def test_new_session_is_empty(self) -> None:
        assert self.make().load(uuid.uuid4().hex) == {}

    def test_state_round_trips_per_session(self) -> None:
        store = self.make()
        a, b = uuid.uuid4().hex, uuid.uuid4().hex
        store.save(a, {"n": 1, "history": ["héllo", {"x": None}]})
        store.save(b, {"n": 2})
        assert store.load(a) == {"n": 1, "history": ["héllo", {"x": None}]}
        assert store.load(b) == {"n": 2}

    def test_state_that_is_not_json_is_refused(self) -> None:
        with pytest.raises(TypeError):
            self.make().save("s", {"bad": object()})

    def test_state_expires(self) -> None:
        store = self.make(ttl=1)
        session = uuid.uuid4().hex
        store.save(session, {"n": 1})
        time.sleep(2.1)
        assert store.load(session) == {}


class TestInMemorySessions(SessionStoreCases):
    def make(self, ttl: float = 60) -> SessionStore:
        return InMemorySessionStore(ttl=ttl)


@pytest.mark.redis
class TestRedisSessions(SessionStoreCases):
    @pytest.fixture(autouse=True)
    def _server(self, redis_url: str) -> None:
        self.url = redis_url

    def make(self, ttl: float = 60) -> SessionStore:
        return RedisSessionStore(self.url, prefix=f"t:{uuid.uuid4().hex}:", ttl=ttl)


@pytest.mark.aws
class TestDynamoDBSessions(SessionStoreCases):
    @pytest.fixture(autouse=True)
    def _server(self, aws: str) -> None:
        self.table = f"sessions-{uuid.uuid4().hex[:8]}"
        create_table(self.table, "session_id")

    def make(self, ttl: float = 60) -> SessionStore:
        return DynamoDBSessionStore(self.table, ttl=ttl)


def test_factory_errors_name_the_key() -> None:
    with pytest.raises(AKConfigError, match=r"session\.dynamodb\.table_name"):
        create_session_store(SessionConfig(type="dynamodb"))
    with pytest.raises(AKConfigError, match=r"session\.redis"):
        create_session_store(SessionConfig(type="redis"))
    with pytest.raises(AKConfigError, match="unknown session store"):
        create_session_store(SessionConfig(type="mongo"))


def test_in_memory_store_forgets_expired_sessions() -> None:
    store = InMemorySessionStore(ttl=0.2)
    for i in range(100):
        store.save(f"old-{i}", {"i": i})
    time.sleep(0.3)
    store.save("new", {"n": 1})
    assert len(store) == 1
    assert store.load("new") == {"n": 1}
