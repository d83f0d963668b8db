"""The sessions API, written once beside the chat front: list, show and erase a caller's sessions.

Every operation is scoped to the caller's identity (the anonymous one without authentication):
the session a caller names is the one stored under its own key
(:func:`~agentkernel.pipeline.wire.scoping.session_key`), so another identity's session of the same
name is simply not there, and a record that is not the caller's answers exactly like one that
does not exist (404 ``NOT_FOUND``). An erase answers 204 whether or not there was anything to
erase: it is idempotent, and says nothing about what existed.

An erase deletes the session record first (its index entry with it), which fences a turn still
running: that turn's commit is refused on its version, and the runner answers it 409
``SESSION_DELETED`` instead of writing the state back. Then the session's tickets, replies and
stream chunks are erased from the response store, and the caller's quota counts released.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from agentkernel.core.blocking import call
from agentkernel.core.errors import (
    StoreDataLostError,
    StoreError,
    StoreFullError,
    StoreUnavailableError,
)
from agentkernel.pipeline.front.answers import RETRY_AFTER_SECONDS, Answer
from agentkernel.pipeline.front.quota import IdentityQuota
from agentkernel.pipeline.front.store_errors import DATA_LOST
from agentkernel.pipeline.response_store import ResponseStore
from agentkernel.pipeline.session_store.base import SessionRecord, SessionStore
from agentkernel.pipeline.session_store.index import ANONYMOUS, SessionEntry, TurnLog
from agentkernel.pipeline.wire.chat import HTTPError
from agentkernel.pipeline.wire.records import ResponseRecord
from agentkernel.pipeline.wire.scoping import owner_scope, session_key

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "SESSIONS_PATH", "SessionsAPI"]

#: The sessions routes: ``GET`` lists, ``GET /{session_id}`` shows, ``DELETE /{session_id}``.
SESSIONS_PATH = "/api/v1/sessions"
#: Sessions per page when the caller names no ``limit``, and the most it may name.
DEFAULT_LIMIT, MAX_LIMIT = 20, 100
#: Longest cursor accepted, in characters (a real one is well under 400).
MAX_CURSOR = 1024
# What a chat session id may be (as ChatRequest checks it): no control character, no '/'.
_SESSION_ID = re.compile(r"[^\x00-\x1f\x7f/]{1,256}")
_T = TypeVar("_T")


class SessionsAPI:
    """The sessions operations over a session store and a response store, as plain data.

    Args:
        sessions: where session records are kept; ``None`` when this process cannot read
            them (a split IO process configured with in-memory sessions): every call answers 501.
        store: the response store, whose tickets, replies and chunks an erase removes.
        quota: the per-identity counts an erase releases.
        stale_after: ``execution.turn_control.stale_after``, for the session store's turn
            signals should an erase be the first to ask for them (they are made once).
    """

    def __init__(
        self,
        sessions: SessionStore | None,
        store: ResponseStore,
        quota: IdentityQuota,
        stale_after: float,
    ) -> None:
        self.sessions, self.store, self.quota = sessions, store, quota
        self.stale_after = stale_after

    async def list(self, identity: str | None, limit: str | None, cursor: str | None) -> Answer:
        """The caller's sessions, newest activity first, ``limit`` per page after ``cursor``."""
        try:
            sessions = self._store()
            size, after = _limit(limit), _cursor(cursor, identity)
            scope = ANONYMOUS if identity is None else owner_scope(identity)
            page = await self._call(
                sessions.nonblocking, sessions.list_sessions, scope, size, after
            )
        except HTTPError as exc:
            return Answer.of(exc)
        items = [_listed(entry) for entry in page.entries]
        more = _encode_cursor(page.entries[-1]) if page.more and page.entries else None
        return Answer(200, {"sessions": items, "next_cursor": more})

    async def show(self, session_id: str, identity: str | None) -> Answer:
        """One of the caller's sessions: its state, its recent turns and its last reply."""
        try:
            record = await self._own(session_id, identity)
        except HTTPError as exc:
            return Answer.of(exc)
        return Answer(200, _shown(session_id, record))

    async def delete(self, session_id: str, identity: str | None) -> Answer:
        """Erase one of the caller's sessions everywhere; 204 whether or not it existed."""
        try:
            sessions = self._store()
            if not self.store.erases_sessions:
                raise _unsupported(f"{type(self.store).__name__} cannot erase sessions")
            key = session_key(_checked_id(session_id), identity)
            record = await self._call(sessions.nonblocking, sessions.read, key)
            ids = [*record.committed, *TurnLog.of(record.log).request_ids()]
            await self._call(sessions.nonblocking, sessions.delete, key)  # first: fences turns
            if (signals := sessions.turn_signals(self.stale_after)) is not None:
                await self._call(signals.nonblocking, signals.forget_session, key)
            forget, nonblocking = self.store.forget_session, self.store.nonblocking
            erased = await self._call(nonblocking, forget, session_id, identity, ids)
        except HTTPError as exc:
            return Answer.of(exc)
        if self.quota.counts(identity):
            for request_id in erased:  # an erased reply is no longer held against the caller
                released = ResponseRecord(request_id, session_id, 0, owner=identity)
                await self._call(False, self.quota.read, released)
        return Answer(204, None)

    async def _own(self, session_id: str, identity: str | None) -> SessionRecord:
        """The caller's record of ``session_id``; 404 for none, or for one not theirs."""
        sessions = self._store()
        key = session_key(_checked_id(session_id), identity)
        record = await self._call(sessions.nonblocking, sessions.read, key)
        if record.version == 0 or (record.owner is not None and record.owner != identity):
            raise HTTPError(404, "NOT_FOUND", "no such session", session_id=session_id)
        return record

    def _store(self) -> SessionStore:
        if self.sessions is None:
            raise _unsupported(
                "this process cannot read the sessions (session.type in_memory lives in the "
                "runner process); configure a shared session store (redis, dynamodb, postgres)"
            )
        if not self.sessions.lists_sessions:
            raise _unsupported(f"{type(self.sessions).__name__} keeps no index of sessions")
        return self.sessions

    @staticmethod
    async def _call(nonblocking: bool, fn: Callable[..., _T], *args: Any) -> _T:
        """Run a store call (on a thread unless the store never blocks); failures as answers."""
        try:
            return await call(nonblocking, fn, *args)
        except StoreError as exc:
            raise _store_error(exc) from exc


def _checked_id(session_id: str) -> str:
    if not _SESSION_ID.fullmatch(session_id) or session_id in (".", ".."):
        raise HTTPError(
            400,
            "INVALID_REQUEST",
            "a session id is 1-256 characters, without '/' or control characters",
        )
    return session_id


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 3 or not 1 <= int(raw) <= MAX_LIMIT:
        raise HTTPError(400, "INVALID_REQUEST", f"limit must be an integer from 1 to {MAX_LIMIT}")
    return int(raw)


def _cursor(raw: str | None, identity: str | None) -> SessionEntry | None:
    """The entry a page starts after; 400 ``INVALID_CURSOR`` for anything not made here."""
    if not raw:
        return None
    try:
        if len(raw) > MAX_CURSOR:
            raise ValueError("too long")
        at, session_id = json.loads(base64.urlsafe_b64decode(raw.encode("ascii") + b"=="))
        if not isinstance(at, int) or not isinstance(session_id, str) or at < 0:
            raise ValueError("not a cursor")
        return SessionEntry(session_key(_checked_id(session_id), identity), at)
    except (ValueError, TypeError, UnicodeError, binascii.Error, HTTPError) as exc:
        raise HTTPError(
            400, "INVALID_CURSOR", "cursor is not one this API returned; list from the start"
        ) from exc


def _encode_cursor(entry: SessionEntry) -> str:
    doc = json.dumps([entry.active_at, _session_id(entry.key)], separators=(",", ":"))
    return base64.urlsafe_b64encode(doc.encode()).decode("ascii").rstrip("=")


def _session_id(key: str) -> str:
    """The client's session id of a store key (the part after the identity's digest)."""
    return key.rpartition("/")[2]


def _iso(seconds: float) -> str:
    text = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")
    return text.removesuffix("+00:00") + "Z"


def _listed(entry: SessionEntry) -> dict[str, Any]:
    return {"session_id": _session_id(entry.key), "last_activity_at": _iso(entry.active_at / 1000)}


def _shown(session_id: str, record: SessionRecord) -> dict[str, Any]:
    turns = [
        {
            "request_id": entry.request_id,
            "status_code": entry.status_code,
            "error": entry.error,
            "finished_at": _iso(entry.at),
        }
        for entry in reversed(record.log)
    ]
    last = record.last
    reply = None
    if last is not None:
        reply = {
            "request_id": last.request_id,
            "status_code": last.status_code,
            "body": json.loads(last.body),
        }
    return {
        "session_id": session_id,
        "version": record.version,
        "state": record.state,
        "last_activity_at": turns[0]["finished_at"] if turns else None,
        "turns": turns,
        "last_reply": reply,
    }


def _unsupported(message: str) -> HTTPError:
    return HTTPError(501, "NOT_SUPPORTED", message)


def _store_error(exc: StoreError) -> HTTPError:
    if isinstance(exc, StoreDataLostError):
        return HTTPError(503, "STORE_DATA_LOST", DATA_LOST)
    if isinstance(exc, StoreFullError):
        return HTTPError(503, "STORE_FULL", "the store is full and refuses writes; retry")
    if isinstance(exc, StoreUnavailableError):
        retry = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        return HTTPError(503, "STORE_UNAVAILABLE", "a store is unreachable; retry", retry)
    return HTTPError(500, "STORE_ERROR", "a store failed; retry later")
