"""The public contract suite every response store must pass.

Subclass :class:`ResponseStoreContract` and implement :meth:`make_store`::

    class TestMyStore(ResponseStoreContract):
        def make_store(self, ttl: float) -> ResponseStore:
            return MyStore(ttl=ttl)
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import ClassVar

import pytest

from agentkernel.core.errors import ResponseStoreError
from agentkernel.pipeline.response_store.base import ResponseStore
from agentkernel.pipeline.wire.records import ResponseRecord, TurnTicket

__all__ = ["ResponseStoreContract"]


class ResponseStoreContract:
    """Mixin of test cases for a :class:`ResponseStore`."""

    #: Longest time a waiter may take to notice a record written by another thread, seconds.
    wake_latency: ClassVar[float] = 1.0

    def make_store(self, ttl: float) -> ResponseStore:
        """Return a store whose records expire after ``ttl`` seconds, isolated from other tests."""
        raise NotImplementedError

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass for the store."""
        time.sleep(seconds)

    @staticmethod
    def record(body: dict[str, object] | None = None, status: int = 200) -> ResponseRecord:
        return ResponseRecord(uuid.uuid4().hex, "session-ü", status, body or {"result": "ok ✓"})

    def test_put_then_get_round_trips(self) -> None:
        store = self.make_store(60)
        record = ResponseRecord(uuid.uuid4().hex, "s 1", 503, {"error": "x", "n": [1, 2]}, "alice")
        store.put(record)
        assert store.get(record.request_id) == record

    def test_get_of_an_unknown_id_is_none(self) -> None:
        assert self.make_store(60).get(uuid.uuid4().hex) is None

    def test_put_replaces_and_reads_repeat(self) -> None:
        store = self.make_store(60)
        first = self.record({"v": 1})
        store.put(first)
        second = ResponseRecord(first.request_id, first.session_id, 200, {"v": 2})
        store.put(second)
        assert store.get(first.request_id) == store.get(first.request_id) == second

    def test_records_are_isolated_by_request_id(self) -> None:
        store = self.make_store(60)
        a, b = self.record({"who": "a"}), self.record({"who": "b"})
        store.put(a)
        store.put(b)
        assert (store.get(a.request_id), store.get(b.request_id)) == (a, b)

    def test_large_body_round_trips(self) -> None:
        store = self.make_store(60)
        record = self.record({"result": "x" * 100_000})
        store.put(record)
        assert store.get(record.request_id) == record

    def test_record_expires_after_its_ttl(self) -> None:
        store = self.make_store(1.0)
        record = self.record()
        store.put(record)
        assert store.get(record.request_id) == record
        self.advance(2.2)
        assert store.get(record.request_id) is None

    def test_wait_returns_when_another_thread_writes(self) -> None:
        store = self.make_store(60)
        record = self.record()
        writer = threading.Timer(0.2, store.put, (record,))
        started = time.monotonic()
        writer.start()
        try:
            got = asyncio.run(store.wait(record.request_id, 10))
        finally:
            writer.join(5)
        assert got == record
        assert time.monotonic() - started < 0.2 + self.wake_latency

    def test_wait_returns_at_once_for_an_existing_record(self) -> None:
        store = self.make_store(60)
        record = self.record()
        store.put(record)
        started = time.monotonic()
        assert asyncio.run(store.wait(record.request_id, 10)) == record
        assert time.monotonic() - started < self.wake_latency

    def test_wait_times_out_with_none(self) -> None:
        store = self.make_store(60)
        started = time.monotonic()
        assert asyncio.run(store.wait(uuid.uuid4().hex, 0.3)) is None
        assert 0.25 < time.monotonic() - started < 0.3 + self.wake_latency

    def test_many_concurrent_waiters_are_all_woken(self) -> None:
        store = self.make_store(60)
        records = [self.record({"i": i}) for i in range(20)]

        async def scenario() -> list[ResponseRecord | None]:
            waits = [asyncio.create_task(store.wait(r.request_id, 10)) for r in records]
            await asyncio.sleep(0.1)
            for r in records:
                await asyncio.to_thread(store.put, r)
            return list(await asyncio.gather(*waits))

        assert asyncio.run(scenario()) == records

    # -- watches: opened before the turn is sent ---------------------------------------------------

    #: Longest time a watch may take to see a reply written before it was opened, seconds.
    watch_recheck: ClassVar[float] = 1.0

    def watch_result(
        self, store: ResponseStore, request_id: str, timeout: float, during: object = None
    ) -> tuple[ResponseRecord | None, float]:
        """Open a watch, run ``during(release)`` on a thread, wait; returns (reply, seconds)."""

        async def scenario() -> tuple[ResponseRecord | None, float]:
            loop = asyncio.get_running_loop()
            released: asyncio.Future[None] = loop.create_future()

            def release() -> None:
                loop.call_soon_threadsafe(released.set_result, None)

            async with store.watch(request_id) as watch:
                started = time.monotonic()
                if callable(during):
                    threading.Timer(0.2, during, (release,)).start()
                record = await watch.result(timeout, released)
                return record, time.monotonic() - started

        return asyncio.run(scenario())

    def test_watch_sees_a_reply_written_after_it_opened(self) -> None:
        store, record = self.make_store(60), self.record()
        got, took = self.watch_result(store, record.request_id, 10, lambda _: store.put(record))
        assert got == record and took < 0.2 + self.wake_latency

    def test_watch_sees_a_reply_written_before_it_opened(self) -> None:
        store, record = self.make_store(60), self.record()
        self.watch_result(store, uuid.uuid4().hex, 0.1)  # the store is listening already
        store.put(record)
        got, took = self.watch_result(store, record.request_id, 10)
        assert got == record and took < self.watch_recheck + self.wake_latency

    def test_watch_sees_a_reply_too_large_to_travel_with_its_notification(self) -> None:
        store, record = self.make_store(60), self.record({"result": "x" * 100_000})
        got, took = self.watch_result(store, record.request_id, 10, lambda _: store.put(record))
        assert got == record and took < 0.2 + self.wake_latency

    def test_watch_sees_the_reply_after_its_chunks(self) -> None:
        store, record = self.make_store(60), self.record()

        def write(_: object) -> None:
            store.put_chunks(record.request_id, 0, [{"type": "chunk", "delta": "a"}])
            time.sleep(0.1)
            store.put(record)

        try:
            store.put_chunks(uuid.uuid4().hex, 0, [{"type": "chunk"}])
        except NotImplementedError:
            pytest.skip("the store keeps no chunks")
        got, took = self.watch_result(store, record.request_id, 10, write)
        assert got == record and took < 0.3 + self.wake_latency

    def test_watch_answers_none_when_released_or_after_its_timeout(self) -> None:
        store = self.make_store(60)
        got, took = self.watch_result(store, uuid.uuid4().hex, 10, lambda release: release())
        assert got is None and took < 0.2 + self.wake_latency
        got, took = self.watch_result(store, uuid.uuid4().hex, 0.3)
        assert got is None and 0.25 < took < 0.3 + self.wake_latency

    # -- tickets of accepted turns ---------------------------------------------------------------

    def test_the_first_ticket_of_a_request_id_wins(self) -> None:
        store, request_id = self.make_store(60), uuid.uuid4().hex
        first = TurnTicket(request_id, "session-ü", "digest-1", "alice")
        assert store.ticket(request_id) is None
        if not store.keeps_tickets:  # then it must say so: the API relies on the flag
            assert store.accept(first) is None and store.ticket(request_id) is None
            return
        assert store.accept(first) is None
        assert store.accept(TurnTicket(request_id, "session-ü", "digest-2")) == first
        assert store.ticket(request_id) == first
        assert store.get(request_id) is None  # a ticket is not a reply

    def test_tickets_are_isolated_by_request_id_and_from_replies(self) -> None:
        store = self.make_store(60)
        if not store.keeps_tickets:
            return
        a = TurnTicket(uuid.uuid4().hex, "s", "a")
        b = TurnTicket(uuid.uuid4().hex, "s", "b")
        assert store.accept(a) is None and store.accept(b) is None
        reply = ResponseRecord(a.request_id, "s", 200, {"result": "done"})
        store.put(reply)
        assert (store.ticket(a.request_id), store.ticket(b.request_id)) == (a, b)
        assert store.get(a.request_id) == reply

    def test_ticket_expires_after_its_ttl(self) -> None:
        store = self.make_store(1.0)
        if not store.keeps_tickets:
            return
        ticket = TurnTicket(uuid.uuid4().hex, "s", "digest")
        store.accept(ticket)
        self.advance(2.2)
        assert store.ticket(ticket.request_id) is None
        assert store.accept(TurnTicket(ticket.request_id, "s", "other")) is None

    # -- chunks of streamed replies ---------------------------------------------------------------

    @staticmethod
    def chunk(request_id: str, index: int) -> dict[str, object]:
        return {
            "type": "STREAM_CHUNK",
            "request_id": request_id,
            "index": index,
            "delta": f"é{index}",
        }

    def test_chunks_are_kept_in_order_and_read_after_an_index(self) -> None:
        store, request_id = self.make_store(60), uuid.uuid4().hex
        for i in range(5):
            store.put_chunk(request_id, i, self.chunk(request_id, i))
        assert store.chunks(request_id) == [self.chunk(request_id, i) for i in range(5)]
        assert [c["index"] for c in store.chunks(request_id, after=2)] == [3, 4]
        assert store.chunks(request_id, after=4) == []
        assert store.chunks(uuid.uuid4().hex) == []

    def test_a_redelivered_chunk_is_kept_once(self) -> None:
        store, request_id = self.make_store(60), uuid.uuid4().hex
        store.put_chunk(request_id, 0, self.chunk(request_id, 0))
        store.put_chunk(request_id, 1, self.chunk(request_id, 1))
        store.put_chunk(request_id, 1, self.chunk(request_id, 1) | {"delta": "again"})
        assert [c["delta"] for c in store.chunks(request_id)] == ["é0", "é1"]

    def test_chunks_written_together_are_kept_once_each(self) -> None:
        """A turn run again may group its chunks otherwise: only the indexes not kept count."""
        store, request_id = self.make_store(60), uuid.uuid4().hex
        store.put_chunks(request_id, 0, [self.chunk(request_id, i) for i in range(3)])
        again = [self.chunk(request_id, i) | {"delta": "again"} for i in range(1, 5)]
        store.put_chunks(request_id, 1, again)
        store.put_chunks(request_id, 0, [self.chunk(request_id, 0) | {"delta": "again"}])
        deltas = [c["delta"] for c in store.chunks(request_id)]
        assert deltas == ["é0", "é1", "é2", "again", "again"]
        assert [c["index"] for c in store.chunks(request_id, after=1)] == [2, 3, 4]

    def test_read_stream_reads_the_record_and_the_chunks_after_an_index(self) -> None:
        store, request_id = self.make_store(60), uuid.uuid4().hex
        assert store.read_stream(request_id) == (None, [])
        chunks = [self.chunk(request_id, i) for i in range(3)]
        store.put_chunks(request_id, 0, chunks)
        assert store.read_stream(request_id, 0) == (None, chunks[1:])
        record = ResponseRecord(request_id, "s", 200, {"result": "é0é1é2"})
        store.put(record)
        assert store.read_stream(request_id) == (record, chunks)
        assert store.read_stream(request_id, 2) == (record, [])

    def test_wait_change_wakes_on_a_chunk_and_on_the_record(self) -> None:
        store, request_id = self.make_store(60), uuid.uuid4().hex
        started = time.monotonic()
        writer = threading.Timer(0.2, store.put_chunk, (request_id, 0, self.chunk(request_id, 0)))
        writer.start()
        try:
            assert asyncio.run(store.wait_change(request_id, 10, -1)) is True
        finally:
            writer.join(5)
        assert time.monotonic() - started < 0.2 + self.wake_latency
        assert asyncio.run(store.wait_change(request_id, 0.2, 0)) is False  # nothing new
        store.put(ResponseRecord(request_id, "s", 200, {"result": "é0"}))
        assert asyncio.run(store.wait_change(request_id, 10, 0)) is True

    # -- erasing a session ----------------------------------------------------------------------

    def _turn(
        self, store: ResponseStore, session_id: str, owner: str | None, *, replied: bool = True
    ) -> str:
        """A turn of ``owner``'s ``session_id``: its ticket, one chunk and (``replied``) reply."""
        request_id = uuid.uuid4().hex
        store.accept(TurnTicket(request_id, session_id, "fp", owner))
        store.put_chunk(request_id, 0, self.chunk(request_id, 0))
        if replied:
            store.put(ResponseRecord(request_id, session_id, 200, {"result": "ü"}, owner))
        return request_id

    def test_forget_session_erases_that_sessions_turns_only(self) -> None:
        store = self.make_store(60)
        if not store.erases_sessions:  # a store that cannot must say so: the API relies on it
            with pytest.raises(ResponseStoreError):
                store.forget_session("s", None)
            return
        session = f"s-{uuid.uuid4().hex}"
        answered = self._turn(store, session, "key:alice")
        queued = self._turn(store, session, "key:alice", replied=False)
        others = [
            self._turn(store, session, "key:bob"),  # same session id, another identity
            self._turn(store, session, None),  # same session id, no identity
            self._turn(store, f"{session}-2", "key:alice"),  # same identity, another session
        ]
        erased = store.forget_session(session, "key:alice")
        assert sorted(erased) == sorted([answered, queued])
        for request_id in (answered, queued):
            assert store.get(request_id) is None and store.ticket(request_id) is None
            assert store.chunks(request_id) == []
        for request_id in others:
            assert store.get(request_id) is not None and store.chunks(request_id) != []
        assert store.forget_session(session, "key:alice") == []  # idempotent

    def test_forget_session_checks_the_turns_it_is_told_of(self) -> None:
        store = self.make_store(60)
        if not store.erases_sessions:
            return  # the case above checked that it says so
        session = f"s-{uuid.uuid4().hex}"
        theirs = self._turn(store, session, "key:bob")
        assert store.forget_session(session, "key:alice", [theirs, "unknown"]) == []
        assert store.get(theirs) is not None and store.ticket(theirs) is not None
