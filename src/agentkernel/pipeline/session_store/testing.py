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
from agentkernel.pipeline.session_store.index import ANONYMOUS, LOGGED_TURNS, SessionEntry

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

    @staticmethod
    def scope() -> str:
        """A fresh identity digest (hex, as :func:`~.wire.scoping.session_key`)."""
        return uuid.uuid4().hex

    def commit_in(self, store: SessionStore, key: str, owner: str | None = None) -> SessionRecord:
        """Commit one turn of the session stored under ``key`` (owned by ``owner``)."""
        base = store.read(key)
        if base.owner is None and owner is not None:
            base = SessionRecord(base.state, base.version, base.committed, base.last, owner=owner)
        return store.commit(key, base, _outcome(), {"n": base.version + 1})

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

    def test_commit_turn_commits_and_closes_the_turn(self) -> None:
        store, session = self.make_store(), self.session()
        signals = store.turn_signals()
        if signals is not None:
            signals.open(session, "r1")
            assert signals.start(session, "r1") is None
            signals.open(session, "r2")  # queued behind it: stays open
        outcome = _outcome("r1")
        written = store.commit_turn(session, store.read(session), outcome, {"n": 1})
        assert store.read(session) == written
        assert (written.state, written.version, written.last) == ({"n": 1}, 1, outcome)
        if signals is not None:
            assert signals.open(session, "probe") == ["r2"]

    def test_a_stale_commit_turn_closes_nothing(self) -> None:
        store, session = self.make_store(), self.session()
        signals = store.turn_signals()
        if signals is not None:
            signals.open(session, "r1")
        base = store.read(session)
        store.commit(session, base, _outcome(), {"by": "winner"})
        with pytest.raises(StaleSessionError):
            store.commit_turn(session, base, _outcome("r1"), {"by": "zombie"})
        assert store.read(session).state == {"by": "winner"}
        if signals is not None:
            assert signals.open(session, "probe") == ["r1"]

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

    # -- the index of sessions and the log of turns -------------------------------------------

    def test_commits_are_logged_with_their_outcome_and_bounded(self) -> None:
        store, session = self.make_store(), self.session()
        before = time.time()
        ids = [f"r{i}" for i in range(LOGGED_TURNS + 2)]
        for request_id in ids[:-1]:
            store.commit(session, store.read(session), _outcome(request_id), {"n": 1})
        failed = TurnOutcome(ids[-1], 500, '{"error": "AGENT_ERROR", "message": "boom"}')
        store.commit(session, store.read(session), failed, None)
        log = store.read(session).log
        assert [entry.request_id for entry in log] == ids[-LOGGED_TURNS:]
        assert (log[-1].status_code, log[-1].error) == (500, "AGENT_ERROR")
        assert (log[0].status_code, log[0].error) == (200, None)
        assert before - 1 <= log[0].at <= log[-1].at <= time.time() + 1

    def test_sessions_are_listed_per_identity_newest_first(self) -> None:
        store, mine, theirs = self.make_store(), self.scope(), self.scope()
        keys = [f"{mine}/s{i}" for i in range(5)]
        for key in keys:
            self.commit_in(store, key, f"key:{mine}")
            time.sleep(0.005)  # distinct milliseconds, so the order is the order of writes
        self.commit_in(store, f"{theirs}/s0", f"key:{theirs}")
        self.commit_in(store, keys[1], f"key:{mine}")  # the latest activity
        page = store.list_sessions(mine, 10)
        order = [keys[1], keys[4], keys[3], keys[2], keys[0]]
        assert [entry.key for entry in page.entries] == order and not page.more
        assert [entry.key for entry in store.list_sessions(theirs, 10).entries] == [f"{theirs}/s0"]
        assert store.list_sessions(self.scope(), 10).entries == []

    def test_pages_follow_each_other_without_gaps_or_repeats(self) -> None:
        store, scope = self.make_store(), self.scope()
        keys = {f"{scope}/s{i}" for i in range(7)}
        for key in sorted(keys):
            self.commit_in(store, key, "key:x")
        seen: list[str] = []
        after: SessionEntry | None = None
        for _ in range(10):
            page = store.list_sessions(scope, 3, after)
            seen += [entry.key for entry in page.entries]
            if not page.more:
                break
            after = page.entries[-1]
        assert sorted(seen) == sorted(keys) and len(seen) == len(keys)

    def test_sessions_without_identity_are_listed_apart(self) -> None:
        store, anonymous = self.make_store(), self.session()
        self.commit_in(store, anonymous)
        legacy = self.session()
        self.commit_in(store, legacy, owner="alice")  # unscoped with an owner: adopted, not listed
        listed = {entry.key for entry in store.list_sessions(ANONYMOUS, 1000).entries}
        assert anonymous in listed and legacy not in listed

    def test_delete_erases_the_record_and_its_index_entry(self) -> None:
        store, scope = self.make_store(), self.scope()
        key, kept = f"{scope}/gone", f"{scope}/kept"
        self.commit_in(store, key, "key:x")
        self.commit_in(store, kept, "key:x")
        store.delete(key)
        assert store.read(key) == SessionRecord()
        assert [entry.key for entry in store.list_sessions(scope, 10).entries] == [kept]
        store.delete(key)  # again: nothing there is no error
        store.delete(f"{scope}/never")

    def test_a_turn_read_before_a_delete_cannot_commit_after_it(self) -> None:
        store, key = self.make_store(), f"{self.scope()}/s"
        self.commit_in(store, key, "key:x")
        running = store.read(key)  # a turn in flight read the record
        store.delete(key)
        with pytest.raises(StaleSessionError):
            store.commit(key, running, _outcome(), {"resurrected": True})
        assert store.read(key) == SessionRecord()
        assert store.list_sessions(key.partition("/")[0], 10).entries == []

    def test_a_deleted_session_id_starts_afresh(self) -> None:
        store, key = self.make_store(), f"{self.scope()}/s"
        self.commit_in(store, key, "key:x")
        store.delete(key)
        record = self.commit_in(store, key, "key:x")
        assert (record.version, len(record.log)) == (1, 1)

    def test_a_page_after_an_entry_older_than_any_session_is_empty(self) -> None:
        store, scope = self.make_store(), self.scope()
        self.commit_in(store, f"{scope}/s", "key:x")
        page = store.list_sessions(scope, 10, SessionEntry(f"{scope}/zzz", 1))
        assert (page.entries, page.more) == ([], False)
