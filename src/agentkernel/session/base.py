"""The session store contract."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar


class SessionStore(ABC):
    """Keeps one JSON object of state per session id. Calls are blocking and thread-safe."""

    #: ``load``/``save`` never wait on I/O, so event-loop code may call them inline.
    nonblocking: ClassVar[bool] = False

    @abstractmethod
    def load(self, session_id: str) -> dict[str, Any]:
        """The session's state, or an empty dict for a new session."""

    @abstractmethod
    def save(self, session_id: str, state: dict[str, Any]) -> None:
        """Replace the session's state.

        Raises:
            TypeError: the state is not JSON-serialisable.
        """

    def ping(self) -> None:  # noqa: B027 - optional hook
        """Raise when the backend is unreachable."""
