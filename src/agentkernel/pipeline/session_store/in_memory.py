"""Session records in a dict of this process (embedded topology, tests)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from agentkernel.core.errors import StaleSessionError
from agentkernel.pipeline.session_store.base import SessionRecord, SessionStore
from agentkernel.pipeline.session_store.index import (
    SessionEntry,
    SessionPage,
    now_ms,
    page_of,
    scope_of,
)
from agentkernel.pipeline.turn_control.signals import InMemoryTurnSignals, TurnSignals


class InMemorySessionStore(SessionStore):
    """Records kept as JSON text per session, so what an agent stores is checked to be JSON.

    Sessions are kept in order of their last write, which is also their order of expiry, so
    expired ones are dropped from the front on every write. The index of each identity's
    sessions is a dict of key to last write (milliseconds since the epoch).

    Args:
        ttl: seconds a session lives after its last write.
    """

    nonblocking = True
    lists_sessions = True

    def __init__(self, ttl: float = 604800.0) -> None:
        self._ttl = ttl
        self._data: OrderedDict[str, tuple[float, int, str]] = OrderedDict()
        self._index: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()

    def read(self, session_id: str) -> SessionRecord:
        with self._lock:
            entry = self._data.get(session_id)
        if entry is None or entry[0] <= time.monotonic():
            return SessionRecord()
        return SessionRecord.decode(entry[2], entry[1])

    def write(self, session_id: str, record: SessionRecord, *, expected_version: int) -> None:
        text = record.encode()
        now = time.monotonic()
        with self._lock:
            entry = self._data.get(session_id)
            current = 0 if entry is None or entry[0] <= now else entry[1]
            if current != expected_version:
                raise StaleSessionError(
                    f"session {session_id} is at version {current}, not {expected_version}"
                )
            self._data[session_id] = (now + self._ttl, record.version, text)
            self._data.move_to_end(session_id)
            if (scope := scope_of(session_id, record.owner)) is not None:
                self._index.setdefault(scope, {})[session_id] = now_ms()
            while self._data and next(iter(self._data.values()))[0] <= now:
                self._unindex(self._data.popitem(last=False)[0])

    def _new_turn_signals(self, stale_after: float) -> TurnSignals:
        return InMemoryTurnSignals(stale_after=stale_after)

    def list_sessions(
        self, scope: str, limit: int, after: SessionEntry | None = None
    ) -> SessionPage:
        oldest = now_ms() - int(self._ttl * 1000)
        with self._lock:
            index = dict(self._index.get(scope, {}))
        entries = [SessionEntry(key, at) for key, at in index.items() if at > oldest]
        return page_of(entries, limit, after)

    def delete(self, session_id: str) -> None:
        with self._lock:
            self._data.pop(session_id, None)
            self._unindex(session_id)

    def _unindex(self, session_id: str) -> None:
        scope = scope_of(session_id, None) or ""  # the one index the key can be in
        index = self._index.get(scope)
        if index is not None and index.pop(session_id, None) is not None and not index:
            del self._index[scope]

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)
