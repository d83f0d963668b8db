"""The public contract suite every :class:`TurnSignals` backend must pass.

Subclass :class:`TurnSignalsContract` and implement :meth:`make_signals`::

    class TestMySignals(TurnSignalsContract):
        def make_signals(self, ttl: float, stale_after: float) -> TurnSignals:
            return MySessionStore(ttl=ttl).turn_signals(stale_after=stale_after)
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from agentkernel.pipeline.turn_control.signals import Stop, StopKind, TurnSignals

__all__ = ["TurnSignalsContract"]


def _id(tag: str = "r") -> str:
    return f"{tag}-{uuid.uuid4().hex}-ü"


def _race(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` on threads released at once; their results in order."""
    barrier, results = threading.Barrier(len(calls)), [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        results[index] = calls[index]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


class TurnSignalsContract:
    """Mixin of test cases for a :class:`TurnSignals` backend."""

    def make_signals(self, ttl: float = 60.0, stale_after: float = 60.0) -> TurnSignals:
        """Return isolated signals whose markers live ``ttl`` seconds and whose open turns
        stop counting ``stale_after`` seconds after they were opened."""
        raise NotImplementedError

    # -- open turns ------------------------------------------------------------------------------

    def test_open_lists_the_other_open_turns_oldest_first(self) -> None:
        signals, key = self.make_signals(), _id("s")
        first, second, third = _id(), _id(), _id()
        assert signals.open(key, first) == []
        time.sleep(0.01)
        assert signals.open(key, second) == [first]
        time.sleep(0.01)
        assert signals.open(key, third) == [first, second]

    def test_opening_a_turn_again_changes_nothing(self) -> None:
        signals, key = self.make_signals(), _id("s")
        first, second = _id(), _id()
        signals.open(key, first)
        time.sleep(0.01)
        signals.open(key, second)
        assert signals.open(key, first) == [second]
        assert signals.open(key, second) == [first]

    def test_sessions_do_not_see_each_others_turns(self) -> None:
        signals, one, other = self.make_signals(), _id("s"), _id("s")
        signals.open(one, _id())
        assert signals.open(other, _id()) == []

    def test_a_closed_turn_no_longer_counts(self) -> None:
        signals, key = self.make_signals(), _id("s")
        first, second = _id(), _id()
        signals.open(key, first)
        signals.close(key, first)
        assert signals.open(key, second) == []
        signals.close(key, _id())  # closing an unknown turn is no error
        signals.close(_id("s"), _id())

    def test_exclusive_opens_only_an_idle_session(self) -> None:
        signals, key = self.make_signals(), _id("s")
        first, second = _id(), _id()
        assert signals.open(key, first, exclusive=True) == []
        assert signals.open(key, first, exclusive=True) == []  # itself does not count
        assert signals.open(key, second, exclusive=True) == [first]
        signals.close(key, first)
        assert signals.open(key, _id()) == []  # second was never opened

    def test_exactly_one_of_racing_exclusive_opens_wins(self) -> None:
        signals = self.make_signals()
        for _ in range(10):
            key, ids = _id("s"), [_id() for _ in range(6)]
            calls = [functools.partial(signals.open, key, rid, exclusive=True) for rid in ids]
            results = dict(zip(ids, _race(calls), strict=True))
            winners = [rid for rid, others in results.items() if not others]
            assert len(winners) == 1
            assert all(others == winners for rid, others in results.items() if rid != winners[0])

    def test_a_turn_never_closed_stops_counting_after_stale_after(self) -> None:
        signals, key = self.make_signals(stale_after=1.0), _id("s")
        signals.open(key, _id())
        time.sleep(1.2)
        assert signals.open(key, _id(), exclusive=True) == []

    def test_forgetting_a_session_drops_its_open_turns(self) -> None:
        signals, key = self.make_signals(), _id("s")
        signals.open(key, _id())
        signals.forget_session(key)
        assert signals.open(key, _id()) == []
        signals.forget_session(_id("s"))  # an unknown session is no error

    # -- stops -----------------------------------------------------------------------------------

    def test_the_first_stop_holds(self) -> None:
        signals, key, rid = self.make_signals(), _id("s"), _id()
        first = Stop(StopKind.INTERRUPT, by=_id())
        assert signals.stop(key, rid, first) == first
        assert signals.stop(key, rid, Stop(StopKind.CANCEL)) == first
        assert signals.stops([rid]) == {rid: first}

    def test_a_turn_stopped_before_it_starts_never_starts(self) -> None:
        signals, key, rid = self.make_signals(), _id("s"), _id()
        stop = Stop(StopKind.CANCEL)
        signals.stop(key, rid, stop)
        assert signals.start(key, rid) == stop
        assert signals.start(key, rid) == stop

    def test_a_started_turn_can_be_cancelled_but_not_superseded(self) -> None:
        signals, key, rid, later = self.make_signals(), _id("s"), _id(), _id()
        signals.open(key, rid)
        assert signals.start(key, rid) is None
        assert signals.stop(key, rid, Stop(StopKind.SUPERSEDE, by=later)) is None
        assert signals.stops([rid]) == {}
        rollback = Stop(StopKind.ROLLBACK, by=later)
        assert signals.stop(key, rid, rollback) == rollback
        assert signals.stops([rid]) == {rid: rollback}

    def test_a_superseded_turn_never_starts(self) -> None:
        signals, key, rid, later = self.make_signals(), _id("s"), _id(), _id()
        signals.open(key, rid)
        supersede = Stop(StopKind.SUPERSEDE, by=later)
        assert signals.stop(key, rid, supersede) == supersede
        assert signals.start(key, rid) == supersede

    def test_start_and_supersede_racing_have_one_winner(self) -> None:
        signals = self.make_signals()
        for _ in range(20):
            key, rid, later = _id("s"), _id(), _id()
            signals.open(key, rid)
            supersede = Stop(StopKind.SUPERSEDE, by=later)
            start = functools.partial(signals.start, key, rid)
            stop = functools.partial(signals.stop, key, rid, supersede)
            started, stopped = _race([start, stop])
            assert (started is None) != (stopped is not None), (started, stopped)

    def test_stops_answers_for_many_turns_at_once(self) -> None:
        signals, key = self.make_signals(), _id("s")
        ids = [_id() for _ in range(30)]
        asked = {rid: Stop(StopKind.CANCEL) for rid in ids[::3]}
        for rid, stop in asked.items():
            signals.stop(key, rid, stop)
        assert signals.stops(ids) == asked
        assert signals.stops([]) == {}

    def test_stop_markers_expire_after_the_ttl(self) -> None:
        signals, key, rid = self.make_signals(ttl=1.0), _id("s"), _id()
        signals.stop(key, rid, Stop(StopKind.CANCEL))
        time.sleep(1.3)
        assert signals.stops([rid]) == {}
        assert signals.start(key, rid) is None

    def test_odd_request_ids_are_kept_apart(self) -> None:
        signals, key = self.make_signals(), _id("s:*{x}")
        odd = ["a:b", "a*", "{a}", "a b", "ü" * 100, "x" * 512, "a\\b", "'; DROP TABLE x; --"]
        for rid in odd:
            signals.open(key, rid)
        signals.stop(key, odd[0], Stop(StopKind.CANCEL))
        assert signals.stops(odd) == {odd[0]: Stop(StopKind.CANCEL)}
        assert signals.open(key, "a") == odd

    def test_starting_a_turn_nobody_opened_opens_it_until_closed(self) -> None:
        signals, key, rid = self.make_signals(), _id("s"), _id()
        assert signals.start(key, rid) is None
        assert signals.stop(key, rid, Stop(StopKind.SUPERSEDE, by=_id())) is None
        assert signals.open(key, _id(), exclusive=True) == [rid]
        signals.close(key, rid)
        assert signals.open(key, _id(), exclusive=True) == []

    def test_a_stop_of_a_turn_of_another_session_does_not_see_its_start(self) -> None:
        # Supersede is refused only for the turn started in the same session.
        signals, key, rid = self.make_signals(), _id("s"), _id()
        signals.start(key, rid)
        supersede = Stop(StopKind.SUPERSEDE, by=_id())
        assert signals.stop(_id("s"), _id(), supersede) == supersede

    def test_a_stop_survives_its_encoding(self) -> None:
        for stop in (Stop(StopKind.CANCEL), Stop(StopKind.SUPERSEDE, by="r-ü")):
            assert Stop.decode(stop.encode()) == stop

    def test_a_listener_hears_every_stop_that_holds(self) -> None:
        signals, key, rid = self.make_signals(), _id("s"), _id()
        heard: list[tuple[str, Stop]] = []
        if not signals.listen(lambda request_id, stop: heard.append((request_id, stop))):
            return  # this backend does not push: runners poll it (the other cases)
        stop = Stop(StopKind.CANCEL)
        signals.stop(key, rid, stop)
        deadline = time.monotonic() + 2
        while not heard and time.monotonic() < deadline:
            time.sleep(0.01)
        assert heard == [(rid, stop)]

    def test_ping_answers(self) -> None:
        self.make_signals().ping()
