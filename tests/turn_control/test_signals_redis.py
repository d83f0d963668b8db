"""Turn signals in Redis (real server) pass the contract, and leave no key behind."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from agentkernel.core.errors import SessionStoreUnavailableError
from agentkernel.core.redis_client import redis_client
from agentkernel.pipeline.session_store.base import SessionRecord, TurnOutcome
from agentkernel.pipeline.session_store.redis import RedisSessionStore
from agentkernel.pipeline.turn_control import Stop, StopKind, TurnSignals
from agentkernel.pipeline.turn_control.signals_redis import RedisTurnSignals
from agentkernel.pipeline.turn_control.testing import TurnSignalsContract

pytestmark = pytest.mark.redis


class TestRedisTurnSignals(TurnSignalsContract):
    @pytest.fixture(autouse=True)
    def _server(self, redis_url: str) -> Iterator[None]:
        # a hash-tagged prefix and any client, so the suite also runs on a cluster
        self.url, self.prefix = redis_url, f"{{t:{uuid.uuid4().hex}}}:"
        self.client = redis_client(redis_url)
        yield
        for key in self.client.scan_iter(match=f"{self.prefix}*"):
            self.client.delete(key)
        self.client.close()

    def make_signals(self, ttl: float = 60.0, stale_after: float = 60.0) -> TurnSignals:
        return RedisTurnSignals(self.client, self.prefix, ttl=ttl, stale_after=stale_after)

    def keys(self) -> list[str]:
        return sorted(k.decode() for k in self.client.scan_iter(match=f"{self.prefix}*"))

    def test_the_session_store_keeps_its_signals_under_its_prefix(self) -> None:
        store = RedisSessionStore(self.url, prefix=self.prefix)
        signals = store.turn_signals(stale_after=30.0)
        assert isinstance(signals, RedisTurnSignals) and signals.stale_after == 30.0
        signals.open("s", "r1")
        assert f"{self.prefix}open:s" in self.keys()

    def test_every_key_expires(self) -> None:
        signals = self.make_signals(ttl=50.0, stale_after=20.0)
        signals.open("s", "queued")
        signals.start("s", "running")
        signals.stop("s", "stopped", Stop(StopKind.CANCEL))
        ttls = {key: self.client.pttl(key) for key in self.keys()}
        assert len(ttls) == 3 and all(ttl > 0 for ttl in ttls.values()), ttls
        assert 10_000 < ttls[f"{self.prefix}open:s"] <= 20_000
        assert 10_000 < ttls[f"{self.prefix}turn:running"] <= 20_000
        assert 40_000 < ttls[f"{self.prefix}turn:stopped"] <= 50_000

    def test_closed_turns_and_forgotten_sessions_leave_nothing(self) -> None:
        signals = self.make_signals()
        signals.open("s", "a")
        signals.start("s", "a")
        signals.stop("s", "a", Stop(StopKind.CANCEL))
        signals.close("s", "a")
        assert self.keys() == []
        signals.open("t", "b")
        signals.stop("t", "b", Stop(StopKind.ROLLBACK, by="c"))
        signals.start("t", "d")
        signals.forget_session("t")
        assert self.keys() == []

    def test_a_commit_stands_when_the_close_beside_it_fails(self) -> None:
        store = RedisSessionStore(self.url, prefix=self.prefix)
        signals = store.turn_signals()
        assert signals is not None
        signals.open("s", "r1")
        self.client.set(f"{self.prefix}open:s", "not a set")  # the close's ZREM now fails
        outcome = TurnOutcome("r1", 200, "{}")
        written = store.commit_turn("s", store.read("s"), outcome, {"n": 1})
        assert store.read("s") == written and written.last == outcome

    def test_a_subclass_that_changes_write_keeps_it_for_commit_turn(self) -> None:
        writes: list[str] = []

        class Counting(RedisSessionStore):
            def write(
                self, session_id: str, record: SessionRecord, *, expected_version: int
            ) -> None:
                writes.append(session_id)
                super().write(session_id, record, expected_version=expected_version)

        store = Counting(self.url, prefix=self.prefix)
        signals = store.turn_signals()
        assert signals is not None
        signals.open("s", "r1")
        store.commit_turn("s", store.read("s"), TurnOutcome("r1", 200, "{}"), {"n": 1})
        assert writes == ["s"]
        assert signals.open("s", "probe") == []  # closed all the same

    def test_an_unreachable_redis_is_an_outage(self) -> None:
        signals = RedisTurnSignals(redis.Redis.from_url("redis://127.0.0.1:1/0"), "x:")
        with pytest.raises(SessionStoreUnavailableError, match="start of turn r"):
            signals.start("s", "r")
        with pytest.raises(SessionStoreUnavailableError):
            signals.stops(["r"])
