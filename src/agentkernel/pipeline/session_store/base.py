"""The session store contract: per-session state plus the outcomes of the session's turns.

A session is kept as one :class:`SessionRecord`: the agent's JSON state, a version that every
commit raises by one, the request ids of the latest committed turns and the reply of the last
one. A turn reads the record, runs, and commits its new state together with its reply in one
conditional write (:meth:`SessionStore.commit`). The write only succeeds if the version is still
the one the turn read, so an older or concurrent attempt of the same session loses
(:class:`StaleSessionError`) instead of overwriting newer state. A redelivered turn whose
request id is already in the record is not run again.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from agentkernel.core.errors import StaleSessionError

#: How many committed request ids a record remembers. A redelivery can only concern the
#: session's latest turns (a session runs one turn at a time), so a short window is plenty.
REMEMBERED_TURNS = 64


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
    """

    state: dict[str, Any] = field(default_factory=dict)
    version: int = 0
    committed: tuple[str, ...] = ()
    last: TurnOutcome | None = None
    trial: str | None = None
    owner: str | None = None

    def is_committed(self, request_id: str) -> bool:
        """Whether a turn with this request id has already been committed."""
        return request_id in self.committed

    def outcome(self, request_id: str) -> TurnOutcome | None:
        """The committed reply of ``request_id`` if it is the latest turn, else ``None``."""
        if self.last is not None and self.last.request_id == request_id:
            return self.last
        return None

    def advance(self, outcome: TurnOutcome, state: dict[str, Any] | None) -> SessionRecord:
        """The record after committing ``outcome`` (``state=None`` keeps the current state)."""
        ids = [i for i in self.committed if i != outcome.request_id] + [outcome.request_id]
        return SessionRecord(
            state=self.state if state is None else state,
            version=self.version + 1,
            committed=tuple(ids[-REMEMBERED_TURNS:]),
            last=outcome,
            owner=self.owner,
        )

    def on_trial(self, request_id: str) -> SessionRecord:
        """The record noting that ``request_id`` has started its last allowed delivery."""
        return replace(self, version=self.version + 1, trial=request_id)

    def encode(self) -> str:
        """JSON text of the record (without the version, which stores keep beside it).

        Raises:
            TypeError: the state is not JSON-serialisable.
        """
        last = None if self.last is None else _outcome_doc(self.last)
        doc = {"state": self.state, "turns": list(self.committed), "last": last}
        optional = {"trial": self.trial, "owner": self.owner}
        return json.dumps(doc | {k: v for k, v in optional.items() if v is not None})

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
            TypeError: the state is not JSON-serialisable.
        """

    def commit(
        self,
        session_id: str,
        base: SessionRecord,
        outcome: TurnOutcome,
        state: dict[str, Any] | None,
    ) -> SessionRecord:
        """Commit a turn read at ``base``: its reply and (unless ``None``) its new state.

        Raises:
            StaleSessionError: another attempt committed since ``base`` was read.
        """
        record = base.advance(outcome, state)
        self.write(session_id, record, expected_version=base.version)
        return record

    def load(self, session_id: str) -> dict[str, Any]:
        """The session's state, or an empty dict for a new session."""
        return self.read(session_id).state

    def save(self, session_id: str, state: dict[str, Any]) -> None:
        """Replace the session's state outside any turn (tools, migrations, tests).

        Raises:
            TypeError: the state is not JSON-serialisable.
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

    def ping(self) -> None:  # noqa: B027 - optional hook
        """Raise when the backend is unreachable, refuses writes or lost its data."""

    def warnings(self) -> list[str]:
        """What an operator should know about the backend (shown by ``GET /ready``)."""
        return []
