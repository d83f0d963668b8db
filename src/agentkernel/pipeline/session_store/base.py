"""The session store contract: per-session state plus the outcomes of the session's turns.

A session is kept as one :class:`SessionRecord`: the agent's JSON state, a version that every
commit raises by one, the request ids of the latest committed turns and the reply of the last
one, and the broker position (:class:`~agentkernel.pipeline.wire.position.Position`) of the latest
applied turn. A turn reads the record, runs, and commits its new state together with its reply
in one conditional write (:meth:`SessionStore.commit`). The write only succeeds if the version
is still the one the turn read, so an older or concurrent attempt of the same session loses
(:class:`StaleSessionError`) instead of overwriting newer state. A redelivered turn is not run
again when its request id is in the record, or when its position is at or below the applied one
(however many turns came after it; see :meth:`SessionRecord.has_applied`).

Records are versioned (``format`` in the JSON): a record written before positions existed
(format 1) decodes with no applied position and falls back to the request-id window.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import pydantic_core

from agentkernel.core.errors import SessionStateError, SessionStoreError, StaleSessionError
from agentkernel.pipeline.session_store.index import (
    LOGGED_TURNS,
    SessionEntry,
    SessionPage,
    TurnEntry,
    TurnLog,
)
from agentkernel.pipeline.turn_control.signals import (
    STALE_AFTER_SECONDS,
    TurnSignals,
    close_quietly,
)
from agentkernel.pipeline.wire.position import Position

#: How many committed request ids a record remembers. The applied position recognises older
#: replays; the ids cover deliveries without a comparable position (another ordering unit, a
#: broker without one, a record of format 1).
REMEMBERED_TURNS = 64
#: The JSON layout written by :meth:`SessionRecord.encode`: 2 added ``applied``.
RECORD_FORMAT = 2


@dataclass(frozen=True)
class TurnOutcome:
    """The reply a committed turn answered with.

    Attributes:
        request_id: the turn's id.
        status_code: HTTP-style status of the reply (200, 500, ...).
        body: the reply document as JSON text.
    """

    request_id: str
    status_code: int
    body: str


@dataclass(frozen=True)
class SessionRecord:
    """One session as stored: state, version, and what its latest turns answered.

    Attributes:
        state: the agent's JSON state.
        version: 0 for a session never committed; each commit adds one.
        committed: request ids of the latest committed turns, oldest first.
        last: the reply of the latest committed turn.
        trial: request id of a turn whose last allowed delivery has started (it runs alone
            in its process, so a crash then is its own doing).
        owner: the user id that created the session, when authentication is on.
        applied: broker position of the latest committed turn that had one.
        adopted_by: on a record stored before sessions were scoped per identity, the identity
            that adopted it (:mod:`~agentkernel.pipeline.session_store.adoption`).
        log: the latest committed turns (at most ``LOGGED_TURNS``), oldest first.
    """

    state: dict[str, Any] = field(default_factory=dict)
    version: int = 0
    committed: tuple[str, ...] = ()
    last: TurnOutcome | None = None
    trial: str | None = None
    owner: str | None = None
    applied: Position | None = None
    adopted_by: str | None = None
    log: Sequence[TurnEntry] = TurnLog()

    def is_committed(self, request_id: str) -> bool:
        """Whether a turn with this request id has already been committed."""
        return request_id in self.committed

    def has_applied(self, request_id: str, position: Position | None) -> bool:
        """Whether a delivery of ``request_id`` at ``position`` was already applied.

        True when the id is among the remembered ones, or when the delivery comes from the
        unit of the applied position at or below it: a session's messages are delivered in
        their unit's order, so everything up to the applied one was handled before.
        """
        if request_id in self.committed:
            return True
        return self.applied is not None and self.applied.covers(position)

    def outcome(self, request_id: str) -> TurnOutcome | None:
        """The committed reply of ``request_id`` if it is the latest turn, else ``None``."""
        if self.last is not None and self.last.request_id == request_id:
            return self.last
        return None

    def advance(
        self,
        outcome: TurnOutcome,
        state: dict[str, Any] | None,
        position: Position | None = None,
    ) -> SessionRecord:
        """The record after committing ``outcome`` (``state=None`` keeps the current state).

        Args:
            position: where the turn was delivered from; ``None`` keeps the applied position.
        """
        ids = [i for i in self.committed if i != outcome.request_id] + [outcome.request_id]
        entry = TurnEntry.of(outcome.request_id, outcome.status_code, outcome.body)
        return SessionRecord(
            state=self.state if state is None else state,
            version=self.version + 1,
            committed=tuple(ids[-REMEMBERED_TURNS:]),
            last=outcome,
            owner=self.owner,
            applied=self.applied if position is None else position.later(self.applied),
            log=TurnLog.of(self.log).appended(entry, LOGGED_TURNS),
        )

    def on_trial(self, request_id: str) -> SessionRecord:
        """The record noting that ``request_id`` has started its last allowed delivery."""
        return replace(self, version=self.version + 1, trial=request_id)

    def encode(self) -> str:
        """JSON text of the record (without the version, which stores keep beside it).

        The state is encoded by :func:`json.dumps`, as an agent's state always was; the rest,
        which this module writes and which is most of a long session's record (its latest
        request ids and turns), by pydantic-core's encoder, five times faster on it.

        Raises:
            SessionStateError: the state is not JSON-serialisable.
        """
        try:
            state = json.dumps(self.state)
        except (TypeError, ValueError) as exc:  # ValueError: a circular reference
            raise SessionStateError(f"the session state is not JSON-serialisable: {exc}") from exc
        last = None if self.last is None else _outcome_doc(self.last)
        rest: dict[str, Any] = {"turns": list(self.committed), "last": last}
        applied = None if self.applied is None else self.applied.to_doc()
        optional = {"trial": self.trial, "owner": self.owner, "applied": applied}
        optional["adopted_by"] = self.adopted_by
        rest |= {k: v for k, v in optional.items() if v is not None}
        if self.log:
            rest["log"] = TurnLog.of(self.log).docs()
        try:
            tail = pydantic_core.to_json(rest).decode()
        except ValueError:  # text it cannot write as UTF-8 (a lone surrogate): escaped instead
            tail = json.dumps(rest)
        return f'{{"format": {RECORD_FORMAT}, "state": {state}, {tail[1:]}'

    @classmethod
    def decode(cls, text: str | bytes, version: int) -> SessionRecord:
        """The record stored as ``text`` at ``version``."""
        doc = json.loads(text)
        last = doc.get("last")
        return cls(
            state=dict(doc.get("state") or {}),
            version=version,
            committed=tuple(doc.get("turns") or ()),
            last=None if last is None else TurnOutcome(**last),
            trial=doc.get("trial"),
            owner=doc.get("owner"),
            applied=Position.from_doc(doc.get("applied")),
            adopted_by=doc.get("adopted_by"),
            log=TurnLog(doc.get("log") or ()),
        )


def _outcome_doc(outcome: TurnOutcome) -> dict[str, Any]:
    # What dataclasses.asdict gives, without its recursive deep copy (once per turn).
    return {
        "request_id": outcome.request_id,
        "status_code": outcome.status_code,
        "body": outcome.body,
    }


class SessionStore(ABC):
    """Keeps one :class:`SessionRecord` per session id. Calls are blocking and thread-safe.

    Backends implement :meth:`read` and :meth:`write`, where ``write`` is a compare-and-set on
    the version (one Redis script, one DynamoDB conditional put, one lock in memory).
    """

    #: ``read``/``write`` never wait on I/O, so event-loop code may call them inline.
    nonblocking: ClassVar[bool] = False
    #: Whether :meth:`list_sessions` and :meth:`delete` work (the built-in stores: yes).
    lists_sessions: ClassVar[bool] = False

    @abstractmethod
    def read(self, session_id: str) -> SessionRecord:
        """The session's record; an empty one at version 0 for a new or expired session.

        Raises:
            SessionStoreError: the backend failed.
        """

    @abstractmethod
    def write(self, session_id: str, record: SessionRecord, *, expected_version: int) -> None:
        """Store ``record`` if the stored version is still ``expected_version``.

        Raises:
            StaleSessionError: the stored version differs; nothing was written.
            SessionStoreError: the backend failed.
            SessionStateError: the state is not JSON-serialisable, or too large for the store.
        """

    def commit(
        self,
        session_id: str,
        base: SessionRecord,
        outcome: TurnOutcome,
        state: dict[str, Any] | None,
        position: Position | None = None,
    ) -> SessionRecord:
        """Commit a turn read at ``base``: its reply and (unless ``None``) its new state.

        Args:
            position: where the turn was delivered from (kept as the applied position).

        Raises:
            StaleSessionError: another attempt committed since ``base`` was read.
            SessionStateError: the state is not JSON-serialisable, or too large for the store.
        """
        record = base.advance(outcome, state, position)
        self.write(session_id, record, expected_version=base.version)
        return record

    def commit_turn(
        self,
        session_id: str,
        base: SessionRecord,
        outcome: TurnOutcome,
        state: dict[str, Any] | None,
        position: Position | None = None,
    ) -> SessionRecord:
        """:meth:`commit`, then close the turn (``outcome.request_id``) in :meth:`turn_signals`
        under ``session_id``: its outcome is decided, so it no longer counts as open in its
        session. The close is best effort: a failure is logged, the commit stands.

        A store whose signals live beside its records may do both in one step.

        Raises:
            as :meth:`commit` (and then nothing was closed).
        """
        record = self.commit(session_id, base, outcome, state, position)
        if (signals := self.turn_signals()) is not None:
            close_quietly(signals, session_id, outcome.request_id)
        return record

    def load(self, session_id: str) -> dict[str, Any]:
        """The session's state, or an empty dict for a new session."""
        return self.read(session_id).state

    def save(self, session_id: str, state: dict[str, Any]) -> None:
        """Replace the session's state outside any turn (tools, migrations, tests).

        Raises:
            SessionStateError: the state is not JSON-serialisable, or too large for the store.
        """
        for _ in range(16):
            record = self.read(session_id)
            new = replace(record, state=state, version=record.version + 1)
            try:
                self.write(session_id, new, expected_version=record.version)
                return
            except StaleSessionError:
                continue
        raise StaleSessionError(f"session {session_id} kept changing while it was saved")

    def list_sessions(
        self, scope: str, limit: int, after: SessionEntry | None = None
    ) -> SessionPage:
        """The sessions of ``scope`` (:func:`~.index.scope_of`) written within the TTL, newest
        write first, ``limit`` of them after ``after`` (a page's last entry).

        Raises:
            SessionStoreError: the backend failed, or keeps no index (``lists_sessions``).
        """
        raise SessionStoreError(f"{type(self).__name__} keeps no index of sessions")

    def delete(self, session_id: str) -> None:
        """Erase the record of ``session_id`` and its index entry; nothing there is no error.

        A turn of the session that read the record before and commits after is refused
        (:class:`StaleSessionError`): its version no longer matches.

        Raises:
            SessionStoreError: the backend failed, or cannot erase (``lists_sessions``).
        """
        raise SessionStoreError(f"{type(self).__name__} cannot erase sessions")

    # -- turn control ------------------------------------------------------------------------

    def turn_signals(self, stale_after: float = STALE_AFTER_SECONDS) -> TurnSignals | None:
        """The turn signals kept beside these sessions (cancellation, multitask strategies),
        made once; ``stale_after`` is taken from the first call.

        Returns ``None`` when this store keeps none: turns can then be neither cancelled nor
        told apart as queued (every built-in store keeps them).
        """
        signals = self.__dict__.get("_turn_signals")
        if signals is None:  # setdefault: two threads asking at once get the same signals
            signals = self.__dict__.setdefault("_turn_signals", self._new_turn_signals(stale_after))
        return signals

    def _new_turn_signals(self, stale_after: float) -> TurnSignals | None:
        """The signals of this store; a store whose sessions other processes read must keep
        them where those processes can read them too."""
        return None

    def ping(self) -> None:  # noqa: B027 - optional hook
        """Raise when the backend is unreachable, refuses writes or lost its data."""

    def warnings(self) -> list[str]:
        """What an operator should know about the backend (shown by ``GET /ready``)."""
        return []

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads (the process that made the store closes it)."""
