"""Session records in a dict of this process (embedded topology, tests)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from agentkernel.core.errors import StaleSessionError
from agentkernel.pipeline.session_store.base import SessionRecord, SessionStore


class InMemorySessionStore(SessionStore):
    """Records kept as JSON text per session, so what an agent stores is checked to be JSON.

    Sessions are kept in order of their last write, which is also their order of expiry, so
    expired ones are dropped from the front on every write.

    Args:
        ttl: seconds a session lives after its last write.
    """

    nonblocking = True

    def __init__(self, ttl: float = 604800.0) -> None:
        self._ttl = ttl
        self._data: OrderedDict[str, tuple[float, int, str]] = OrderedDict()
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
            while self._data and next(iter(self._data.values()))[0] <= now:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)
