"""The public contract suite every quota ledger must pass.

Subclass :class:`QuotaLedgerContract` and implement :meth:`make_ledgers`::

    class TestMyLedger(QuotaLedgerContract):
        def make_ledgers(self, ttl: float) -> tuple[QuotaLedger, QuotaLedger]:
            store = MyStore(ttl=ttl)
            return store.quota_ledger(), MyStore(ttl=ttl).quota_ledger()

The two ledgers are two fronts' views of the same counts: for a shared store, two independent
objects with their own clients; for a process-local one, the same ledger twice.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import ClassVar

from agentkernel.pipeline.quota import Quota, QuotaLedger

__all__ = ["QuotaLedgerContract"]

TURNS = Quota(unread_turns=3, reply_bytes=None)
BYTES = Quota(unread_turns=None, reply_bytes=1000)


class QuotaLedgerContract:
    """Mixin of test cases for a :class:`QuotaLedger`."""

    #: How much longer than the TTL stored bytes may count, as a share of the TTL (a ledger
    #: counting them in time buckets).
    bytes_grace: ClassVar[float] = 0.0

    def make_ledgers(self, ttl: float) -> tuple[QuotaLedger, QuotaLedger]:
        """Two fronts' ledgers over the same counts, isolated from other tests."""
        raise NotImplementedError

    def ledger(self, ttl: float = 60.0) -> QuotaLedger:
        return self.make_ledgers(ttl)[0]

    @staticmethod
    def owner() -> str:
        return f"key:user-{uuid.uuid4().hex[:8]}"

    @staticmethod
    def ids(n: int) -> list[str]:
        return [uuid.uuid4().hex for _ in range(n)]

    def test_unread_turns_are_admitted_up_to_the_cap(self) -> None:
        ledger, owner = self.ledger(), self.owner()
        assert [ledger.admit(owner, i, TURNS) for i in self.ids(3)] == [None] * 3
        wait = ledger.admit(owner, uuid.uuid4().hex, TURNS)
        assert wait is not None and 0 < wait <= 60

    def test_a_counted_turn_is_admitted_again_at_the_cap(self) -> None:
        ledger, owner, ids = self.ledger(), self.owner(), self.ids(3)
        for request_id in ids:
            ledger.admit(owner, request_id, TURNS)
        assert ledger.admit(owner, ids[1], TURNS) is None
        assert ledger.admit(owner, uuid.uuid4().hex, TURNS) is not None

    def test_reading_a_reply_frees_its_place(self) -> None:
        ledger, owner, ids = self.ledger(), self.owner(), self.ids(3)
        for request_id in ids:
            ledger.admit(owner, request_id, TURNS)
        ledger.read(owner, ids[0])
        ledger.read(owner, ids[0])  # twice, and an id never counted: both harmless
        ledger.read(owner, uuid.uuid4().hex)
        assert ledger.admit(owner, uuid.uuid4().hex, TURNS) is None
        assert ledger.admit(owner, uuid.uuid4().hex, TURNS) is not None

    def test_reading_for_an_identity_never_counted_is_harmless(self) -> None:
        ledger = self.ledger()
        ledger.read(self.owner(), uuid.uuid4().hex)

    def test_identities_are_counted_apart(self) -> None:
        ledger, alice, bob = self.ledger(), self.owner(), self.owner()
        for request_id in self.ids(3):
            ledger.admit(alice, request_id, TURNS)
        assert ledger.admit(bob, uuid.uuid4().hex, TURNS) is None
        assert ledger.admit(alice, uuid.uuid4().hex, TURNS) is not None

    def test_unread_turns_stop_counting_when_the_ttl_ends(self) -> None:
        ledger, owner = self.ledger(ttl=1.0), self.owner()
        for request_id in self.ids(3):
            ledger.admit(owner, request_id, TURNS)
        wait = ledger.admit(owner, uuid.uuid4().hex, TURNS)
        assert wait is not None and wait <= 1.0
        time.sleep(1.2)
        assert [ledger.admit(owner, i, TURNS) for i in self.ids(3)] == [None] * 3

    def test_stored_bytes_are_capped(self) -> None:
        ledger, owner, other = self.ledger(), self.owner(), self.owner()
        ledger.stored(owner, "r1", 600)
        assert ledger.admit(owner, uuid.uuid4().hex, BYTES) is None
        ledger.stored(owner, "r2#0", 400)
        wait = ledger.admit(owner, uuid.uuid4().hex, BYTES)
        assert wait is not None and 0 < wait <= 60 * (1 + self.bytes_grace)
        assert ledger.admit(other, uuid.uuid4().hex, BYTES) is None

    def test_stored_bytes_stop_counting_when_the_ttl_ends(self) -> None:
        ledger, owner = self.ledger(ttl=1.0), self.owner()
        ledger.stored(owner, "r1", 5000)
        assert ledger.admit(owner, uuid.uuid4().hex, BYTES) is not None
        time.sleep(1.2 + self.bytes_grace)  # the TTL is 1 s
        assert ledger.admit(owner, uuid.uuid4().hex, BYTES) is None

    def test_with_both_caps_off_every_turn_is_admitted(self) -> None:
        ledger, owner = self.ledger(), self.owner()
        ledger.stored(owner, "r", 10**9)
        off = Quota(unread_turns=None, reply_bytes=None)
        assert [ledger.admit(owner, i, off) for i in self.ids(5)] == [None] * 5

    def test_two_fronts_share_one_cap(self) -> None:
        first, second = self.make_ledgers(60.0)
        owner, ids = self.owner(), self.ids(4)
        assert first.admit(owner, ids[0], TURNS) is None
        assert second.admit(owner, ids[1], TURNS) is None
        assert first.admit(owner, ids[2], TURNS) is None
        assert second.admit(owner, ids[3], TURNS) is not None
        second.read(owner, ids[0])  # read through the other front
        assert first.admit(owner, ids[3], TURNS) is None
        second.stored(owner, "big", 2000)
        assert first.admit(owner, uuid.uuid4().hex, BYTES) is not None

    def test_concurrent_admits_never_pass_the_cap(self) -> None:
        ledgers, owner = self.make_ledgers(60.0), self.owner()
        quota = Quota(unread_turns=5, reply_bytes=None)
        admitted: list[str] = []
        lock, start = threading.Lock(), threading.Barrier(8)

        def front(ledger: QuotaLedger) -> None:
            start.wait(timeout=10)
            for request_id in self.ids(3):
                if ledger.admit(owner, request_id, quota) is None:
                    with lock:
                        admitted.append(request_id)

        threads = [threading.Thread(target=front, args=(ledgers[i % 2],)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
        assert len(admitted) == 5
