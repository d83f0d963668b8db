"""The public contract suite every session store must pass.

Subclass :class:`SessionStoreContract` and implement :meth:`make_store`::

    class TestMySessions(SessionStoreContract):
        def make_store(self, ttl: float) -> SessionStore:
            return MySessionStore(ttl=ttl)
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from agentkernel.core.errors import SessionStateError, StaleSessionError
from agentkernel.pipeline.session_store.base import (
    REMEMBERED_TURNS,
    SessionRecord,
    SessionStore,
    TurnOutcome,
)

__all__ = ["SessionStoreContract"]


def _outcome(request_id: str | None = None, status: int = 200) -> TurnOutcome:
    return TurnOutcome(request_id or uuid.uuid4().hex, status, '{"result": "ok ✓"}')


class SessionStoreContract:
    """Mixin of test cases for a :class:`SessionStore`."""

    def make_store(self, ttl: float = 60.0) -> SessionStore:
        """Return a store whose sessions expire ``ttl`` seconds after a write, isolated."""
        raise NotImplementedError

    @staticmethod
    def session() -> str:
        return f"s-{uuid.uuid4().hex}-ü"

    def test_new_session_is_empty_at_version_zero(self) -> None:
        record = self.make_store().read(self.session())
        assert record == SessionRecord()
        assert self.make_store().load(self.session()) == {}

    def test_commit_stores_state_and_outcome_together(self) -> None:
        store, session = self.make_store(), self.session()
        outcome = _outcome()
        state = {"history": ["héllo", {"x": None}], "n": 1}
        written = store.commit(session, store.read(session), outcome, state)
        record = store.read(session)
        assert record == written
        assert (record.state, record.version, record.last) == (state, 1, outcome)
        assert record.is_committed(outcome.request_id)
        assert record.outcome(outcome.request_id) == outcome

    def test_commit_without_state_keeps_the_state(self) -> None:
        store, session = self.make_store(), self.session()
        store.commit(session, store.read(session), _outcome(), {"n": 1})
        failed = _outcome(status=500)
        store.commit(session, store.read(session), failed, None)
        record = store.read(session)
        assert (record.state, record.version, record.last) == ({"n": 1}, 2, failed)

    def test_stale_commit_is_refused_and_changes_nothing(self) -> None:
        store, session = self.make_store(), self.session()
        base = store.read(session)
        winner = _outcome()
        store.commit(session, base, winner, {"by": "winner"})
        with pytest.raises(StaleSessionError):
            store.commit(session, base, _outcome(), {"by": "zombie"})
        record = store.read(session)
        assert (record.state, record.version, record.last) == ({"by": "winner"}, 1, winner)

    def test_concurrent_commits_from_one_version_have_one_winner(self) -> None:
        store, session = self.make_store(), self.session()
        base = store.read(session)
        wins: list[int] = []
        stale: list[int] = []

        def attempt(i: int) -> None:
            try:
                store.commit(session, base, _outcome(f"r{i}"), {"i": i})
                wins.append(i)
            except StaleSessionError:
                stale.append(i)

        threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert len(wins) == 1 and len(stale) == 7
        assert store.read(session).state == {"i": wins[0]}

    def test_remembered_turns_are_bounded_and_ordered(self) -> None:
        store, session = self.make_store(), self.session()
        ids = [f"r{i}" for i in range(REMEMBERED_TURNS + 3)]
        for request_id in ids:
            store.commit(session, store.read(session), _outcome(request_id), {"last": request_id})
        record = store.read(session)
        assert record.committed == tuple(ids[-REMEMBERED_TURNS:])
        assert not record.is_committed(ids[0]) and record.is_committed(ids[-1])
        assert record.outcome(ids[-2]) is None and record.version == len(ids)

    def test_state_that_is_not_json_is_refused(self) -> None:
        store, session = self.make_store(), self.session()
        with pytest.raises(SessionStateError, match="not JSON-serialisable"):
            store.commit(session, store.read(session), _outcome(), {"bad": object()})
        assert store.read(session).version == 0

    def test_save_outside_a_turn_keeps_the_outcomes(self) -> None:
        store, session = self.make_store(), self.session()
        outcome = _outcome()
        store.commit(session, store.read(session), outcome, {"n": 1})
        store.save(session, {"n": 2})
        record = store.read(session)
        assert (record.state, record.last, record.version) == ({"n": 2}, outcome, 2)

    def test_sessions_expire(self) -> None:
        store, session = self.make_store(ttl=1), self.session()
        store.save(session, {"n": 1})
        time.sleep(2.1)
        assert store.load(session) == {}
