"""The response store contract: replies keyed by request id, readable until their TTL ends."""

from __future__ import annotations

import asyncio
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from agentkernel.core.errors import ResponseStoreError
from agentkernel.pipeline.quota import InMemoryQuotaLedger, QuotaLedger
from agentkernel.pipeline.wire.records import ResponseRecord, TurnTicket
from agentkernel.pipeline.wire.scoping import session_key

if TYPE_CHECKING:
    from agentkernel.pipeline.response_store.watch import ReplyWatch


class ResponseStore(ABC):
    """Where replies wait to be read. ``put``/``get`` are blocking and thread-safe.

    Args:
        ttl: seconds a record stays readable after it is written.
    """

    #: Whether other processes can read what this store holds.
    shared: ClassVar[bool] = False
    #: ``put``/``get`` never wait on I/O, so event-loop code may call them inline.
    nonblocking: ClassVar[bool] = False
    #: Whether :meth:`wait` is woken by the write itself (no polling).
    pushes: ClassVar[bool] = False
    #: Whether :meth:`accept` keeps tickets (so a read can tell an unknown turn at once).
    keeps_tickets: ClassVar[bool] = False
    #: Longest sleep between two reads of :meth:`wait`'s polling fallback, in seconds.
    max_poll_interval: ClassVar[float] = 0.5

    def __init__(self, ttl: float = 3600.0) -> None:
        self.ttl = ttl
        self._local_secret: bytes | None = None

    @abstractmethod
    def put(self, record: ResponseRecord) -> None:
        """Store ``record``, replacing any earlier record of its request id."""

    @abstractmethod
    def get(self, request_id: str) -> ResponseRecord | None:
        """The record of ``request_id``, or ``None`` when there is none (yet, or any more)."""

    async def wait(self, request_id: str, timeout: float) -> ResponseRecord | None:
        """Wait up to ``timeout`` seconds for the record of ``request_id`` to appear.

        The default polls :meth:`get` with a growing interval (50 ms up to
        ``max_poll_interval``); stores with a notification channel override it.
        """
        deadline = time.monotonic() + timeout
        interval = 0.05
        while True:
            record = await asyncio.to_thread(self.get, request_id)
            remaining = deadline - time.monotonic()
            if record is not None or remaining <= 0:
                return record
            await asyncio.sleep(min(interval, remaining))
            interval = min(interval * 2, self.max_poll_interval)

    def watch(self, request_id: str) -> ReplyWatch:
        """A wait for the reply of ``request_id``, to open (``async with``) before the turn is
        sent and wait on (``await watch.result(timeout)``) after. It sees every reply written
        after it was opened; the default one reads first, like :meth:`wait`, so it sees earlier
        ones too. Stores that push override it so a reply costs no read (see
        :mod:`agentkernel.pipeline.response_store.watch`)."""
        from agentkernel.pipeline.response_store.watch import ReplyWatch

        return ReplyWatch(self, request_id)

    # -- tickets of accepted turns ---------------------------------------------------------------

    def accept(self, ticket: TurnTicket) -> TurnTicket | None:
        """Keep ``ticket`` until the TTL ends unless one of its request id is already kept.

        Returns:
            the ticket kept earlier (the first one wins), or ``None`` when ``ticket`` is new.
            A store that keeps no tickets always returns ``None``: its reads then cannot tell
            a running turn from an unknown one.
        """
        return None

    def ticket(self, request_id: str) -> TurnTicket | None:
        """The ticket of ``request_id``, or ``None`` when there is none (or any more)."""
        return None

    # -- chunks of streamed replies ---------------------------------------------------------------

    def put_chunk(self, request_id: str, index: int, frame: dict[str, Any]) -> None:
        """Keep chunk ``index`` (0-based) of a streamed reply until the TTL ends.

        Chunks arrive in order; one whose index is already kept is ignored (a redelivery).
        """
        raise NotImplementedError(f"{type(self).__name__} does not keep stream chunks")

    def put_chunks(self, request_id: str, first: int, frames: list[dict[str, Any]]) -> None:
        """Keep chunks ``first``, ``first + 1``, ... of a streamed reply (one OUTPUT message's).

        The same rule as :meth:`put_chunk` per chunk: an index already kept is ignored. The
        default calls :meth:`put_chunk` for each; a store that can write them in one round trip
        overrides it.
        """
        for offset, frame in enumerate(frames):
            self.put_chunk(request_id, first + offset, frame)

    def chunks(self, request_id: str, after: int = -1) -> list[dict[str, Any]]:
        """The kept chunk frames of ``request_id`` whose index is above ``after``, in order."""
        return []

    def read_stream(
        self, request_id: str, after: int = -1
    ) -> tuple[ResponseRecord | None, list[dict[str, Any]]]:
        """The record of ``request_id`` and its chunks above ``after``, for a streaming reader.

        The record is read first: chunks are written before their turn's reply, so a reader
        that finds the record also finds every chunk. A store that can read both in one round
        trip overrides this.
        """
        record = self.get(request_id)
        return record, self.chunks(request_id, after)

    async def wait_change(self, request_id: str, timeout: float, seen: int) -> bool:
        """Wait up to ``timeout`` seconds for a chunk above index ``seen`` or the final record.

        Returns whether one is there. The default polls like :meth:`wait`; stores with a
        notification channel override it.
        """
        deadline = time.monotonic() + timeout
        interval = 0.05
        while True:
            if await asyncio.to_thread(self._changed, request_id, seen):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await asyncio.sleep(min(interval, remaining))
            interval = min(interval * 2, self.max_poll_interval)

    def _changed(self, request_id: str, seen: int) -> bool:
        return bool(self.chunks(request_id, seen)) or self.get(request_id) is not None

    # -- erasing a session ------------------------------------------------------------------------

    #: Whether :meth:`forget_session` works (the built-in stores: yes).
    erases_sessions: ClassVar[bool] = False

    def forget_session(
        self, session_id: str, owner: str | None, request_ids: Iterable[str] = ()
    ) -> list[str]:
        """Erase the tickets, replies and chunks of every turn of ``owner``'s ``session_id``.

        The store finds the session's turns in its own per-session index (kept by :meth:`accept`
        and :meth:`put`); ``request_ids`` adds turns it may not have indexed (a session record's
        committed ids), each erased only when its ticket or reply shows it is that session's.

        Returns:
            the request ids whose ticket or reply was erased.

        Raises:
            StoreError: the backend failed, or cannot erase (``erases_sessions`` is off).
        """
        if not self.erases_sessions:
            raise ResponseStoreError(f"{type(self).__name__} cannot erase sessions")
        key = session_key(session_id, owner)
        indexed = set(self._session_requests(key))
        claimed = set(request_ids) - indexed
        erased = [rid for rid in sorted(indexed) if self._erase_turn(rid)]
        for rid in sorted(claimed):
            if self._belongs(rid, session_id, owner) and self._erase_turn(rid):
                erased.append(rid)
        self._forget_requests(key)
        return erased

    def _belongs(self, request_id: str, session_id: str, owner: str | None) -> bool:
        ticket = self.ticket(request_id)
        if ticket is not None:
            return ticket.visible_to(session_id, owner)
        record = self.get(request_id)
        return record is not None and record.visible_to(session_id, owner)

    def _session_requests(self, key: str) -> list[str]:
        """The request ids indexed under the session stored at ``key`` (``erases_sessions``)."""
        raise NotImplementedError

    def _erase_turn(self, request_id: str) -> bool:
        """Delete the ticket, reply and chunks of ``request_id``; whether any was there."""
        raise NotImplementedError

    def _forget_requests(self, key: str) -> None:
        """Drop the per-session index of ``key``."""
        raise NotImplementedError

    # -- per-identity quota counts -------------------------------------------------------------

    def quota_ledger(self) -> QuotaLedger:
        """The per-identity quota counts kept beside these replies (one ledger per store)."""
        ledger = self.__dict__.get("_quota_ledger")
        if ledger is None:  # setdefault: two threads asking at once get the same ledger
            ledger = self.__dict__.setdefault("_quota_ledger", self._new_quota_ledger())
        return ledger  # type: ignore[no-any-return]

    def _new_quota_ledger(self) -> QuotaLedger:
        """This process's counts; a store shared by processes overrides it to share them."""
        return InMemoryQuotaLedger(self.ttl)

    # -- the deployment's secret -------------------------------------------------------------------

    def shared_secret(self) -> bytes:
        """A random secret made once and read by every process that uses this store.

        Request ids derived from an ``Idempotency-Key`` (or a WebSocket client's id) are keyed
        by it when ``api.idempotency_secret`` is not set, so nobody can compute them, while a
        retry that reaches another IO process still finds the same turn. A store only this
        process reads keeps one in memory; a shared store must keep it where all can read it.

        Raises:
            StoreError: the store could not keep or read it (a shared store that does not
                implement this: set ``api.idempotency_secret``).
        """
        if self.shared:
            raise ResponseStoreError(
                f"{type(self).__name__} keeps no shared secret: set api.idempotency_secret"
            )
        if self._local_secret is None:
            self._local_secret = secrets.token_bytes(32)
        return self._local_secret

    def ping(self) -> None:  # noqa: B027 - optional hook
        """Raise a ``StoreError`` when the backend is unreachable, refuses writes or lost its
        data."""

    def warnings(self) -> list[str]:
        """What an operator should know about the backend (shown by ``GET /ready``)."""
        return []

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
