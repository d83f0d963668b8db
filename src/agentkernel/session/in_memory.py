"""Session state in a dict of this process (embedded topology, tests)."""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from typing import Any

from agentkernel.session.base import SessionStore


class InMemorySessionStore(SessionStore):
    """State kept as JSON text per session, so what an agent stores is checked to be JSON.

    Sessions are kept in order of their last save, which is also their order of expiry, so
    expired ones are dropped from the front on every save.

    Args:
        ttl: seconds a session's state lives after its last save.
    """

    nonblocking = True

    def __init__(self, ttl: float = 604800.0) -> None:
        self._ttl = ttl
        self._data: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._lock = threading.Lock()

    def load(self, session_id: str) -> dict[str, Any]:
        with self._lock:
            entry = self._data.get(session_id)
        if entry is None or entry[0] <= time.monotonic():
            return {}
        state: dict[str, Any] = json.loads(entry[1])
        return state

    def save(self, session_id: str, state: dict[str, Any]) -> None:
        text = json.dumps(state)
        now = time.monotonic()
        with self._lock:
            self._data[session_id] = (now + self._ttl, text)
            self._data.move_to_end(session_id)
            while self._data and next(iter(self._data.values()))[0] <= now:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)
