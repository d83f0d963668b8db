"""What a session store keeps so sessions can be listed and shown: the per-identity index and
the per-session log of recent turns.

Every write of a session record (:meth:`SessionStore.write`, the one path every turn's commit
takes on every topology) also refreshes the record's entry in the index of its identity, its
*scope*: the digest part of a scoped key (``<digest>/<session_id>``,
:func:`~agentkernel.pipeline.wire.scoping.session_key`), or :data:`ANONYMOUS` for a session without
an identity. An entry's time is the write's, in milliseconds since the epoch; since a record
lives ``ttl`` seconds after its last write, an entry older than that is an expired session and is
never listed. The log of turns (:class:`TurnEntry`) travels inside the record itself, so it is
committed in the same conditional write as the turn it describes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

__all__ = [
    "ANONYMOUS",
    "LOGGED_TURNS",
    "SessionEntry",
    "SessionPage",
    "TurnEntry",
    "TurnLog",
    "now_ms",
    "scope_of",
]

#: The scope of sessions without an identity (a digest is hex, so no identity's scope is this).
ANONYMOUS = "~"
#: How many turns a record's log keeps (newest last).
LOGGED_TURNS = 50


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch: the time an index entry carries."""
    return int(time.time() * 1000)


def scope_of(key: str, owner: str | None) -> str | None:
    """The index a session stored under ``key`` belongs to, or ``None`` for none.

    A scoped key's digest; :data:`ANONYMOUS` for an unscoped key with no owner. An unscoped
    record with an owner was written before sessions were scoped (it is adopted, never listed).
    """
    digest, slash, _ = key.partition("/")
    if slash:
        return digest
    return ANONYMOUS if owner is None else None


@dataclass(frozen=True)
class TurnEntry:
    """One committed turn in a session's log.

    Attributes:
        request_id: the turn's id.
        status_code: the status of its reply.
        error: the reply's error code (``AGENT_ERROR``, ...), ``None`` for a success.
        at: when it was committed, seconds since the epoch.
    """

    request_id: str
    status_code: int
    error: str | None
    at: float

    @classmethod
    def of(cls, request_id: str, status_code: int, body: str) -> TurnEntry:
        """The entry of a turn committed now with a reply of ``status_code`` and ``body``."""
        return cls(request_id, status_code, _error_code(status_code, body), time.time())

    def to_doc(self) -> dict[str, Any]:
        return {"r": self.request_id, "s": self.status_code, "e": self.error, "t": self.at}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> TurnEntry:
        return cls(str(doc["r"]), int(doc["s"]), doc.get("e"), float(doc["t"]))


class TurnLog(Sequence[TurnEntry]):
    """A session's log of recent turns, oldest first, kept as the JSON objects it is stored as.

    Every turn reads its session's record and writes it back with one more entry, but nothing on
    that path looks at the entries: they become :class:`TurnEntry` objects only when read (the
    sessions API). Decoding and encoding a full log object by object cost about as much as a
    no-op turn. Immutable; equal to any sequence of the same entries.

    Args:
        docs: the entries as stored (:meth:`TurnEntry.to_doc`).

    Raises:
        TypeError: an entry is not a JSON object.
    """

    __slots__ = ("_docs", "_entries")

    def __init__(self, docs: Iterable[dict[str, Any]] = ()) -> None:
        self._docs = tuple(docs)
        if not all(type(doc) is dict for doc in self._docs):
            raise TypeError("a logged turn is not a JSON object")
        self._entries: tuple[TurnEntry, ...] | None = None

    @classmethod
    def _checked(cls, docs: tuple[dict[str, Any], ...]) -> TurnLog:
        """A log of ``docs`` that are JSON objects already (no second look at each, per turn)."""
        log = cls.__new__(cls)
        log._docs, log._entries = docs, None
        return log

    @classmethod
    def of(cls, entries: Iterable[TurnEntry]) -> TurnLog:
        """The log of ``entries`` (itself when it is a :class:`TurnLog` already)."""
        if isinstance(entries, TurnLog):
            return entries
        return cls._checked(tuple(entry.to_doc() for entry in entries))

    def appended(self, entry: TurnEntry, limit: int) -> TurnLog:
        """This log with ``entry`` last, keeping the newest ``limit`` entries."""
        return TurnLog._checked((*self._docs, entry.to_doc())[-limit:])

    def docs(self) -> list[dict[str, Any]]:
        """The entries as they are stored."""
        return list(self._docs)

    def request_ids(self) -> list[str]:
        """The request ids the entries name, without reading the rest of them: an erase finds the
        turns of a log that has an entry it cannot read (such an entry is left out)."""
        return [rid for doc in self._docs if isinstance(rid := doc.get("r"), str)]

    def _read(self) -> tuple[TurnEntry, ...]:
        if self._entries is None:  # a race only builds the same tuple twice
            self._entries = tuple(TurnEntry.from_doc(doc) for doc in self._docs)
        return self._entries

    def __len__(self) -> int:
        return len(self._docs)

    @overload
    def __getitem__(self, index: int) -> TurnEntry: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[TurnEntry]: ...
    def __getitem__(self, index: int | slice) -> TurnEntry | Sequence[TurnEntry]:
        return self._read()[index]

    def __iter__(self) -> Iterator[TurnEntry]:
        return iter(self._read())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return self._read() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._read())

    def __repr__(self) -> str:
        return f"TurnLog({list(self._read())!r})"


@dataclass(frozen=True)
class SessionEntry:
    """A session in its identity's index: its store key and its last write (ms since epoch)."""

    key: str
    active_at: int


@dataclass(frozen=True)
class SessionPage:
    """One page of an identity's sessions, newest activity first; ``more`` when others follow
    the last one."""

    entries: list[SessionEntry]
    more: bool


def _error_code(status_code: int, body: str) -> str | None:
    if status_code < 400:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    code = doc.get("error") if isinstance(doc, dict) else None
    return code if isinstance(code, str) else None


def page_of(entries: list[SessionEntry], limit: int, after: SessionEntry | None) -> SessionPage:
    """The page after ``after`` of ``entries``, ordered newest first (ties by key, descending)."""
    ordered = sorted(entries, key=lambda e: (e.active_at, e.key), reverse=True)
    if after is not None:
        ordered = [e for e in ordered if (e.active_at, e.key) < (after.active_at, after.key)]
    return SessionPage(ordered[:limit], len(ordered) > limit)
