"""Turn signals: which turns of a session are open, and which were asked to stop.

A front (HTTP, WebSocket, Lambda) and the Agent Runner that runs a turn are often different
processes, so what one tells the other about a turn goes through a store both reach, the one
that keeps the sessions: :meth:`SessionStore.turn_signals
<agentkernel.pipeline.session_store.base.SessionStore.turn_signals>`.

- A front **opens** each turn it accepts under its session before it enqueues it, and learns the
  session's other open turns (what ``reject``, ``interrupt``, ``rollback`` and ``coalesce`` act
  on). ``exclusive`` opens it only when nothing else is open (``reject``), in one atomic step.
- A front asks an open turn to **stop** (a cancel, or a later turn's strategy). The first stop
  asked for a turn is the one that holds. ``SUPERSEDE`` only takes on a turn that has not
  started: it and the runner's :meth:`~TurnSignals.start` are one compare-and-set, so a turn is
  either superseded before it runs or runs to its end.
- The runner **starts** a turn (getting the stop asked before it, if any: then it never runs),
  **polls** the stops of the turns it runs (:meth:`~TurnSignals.stops`, one call for all of them)
  and **closes** each turn once its outcome is committed, before its reply is sent
  (:meth:`SessionStore.commit_turn
  <agentkernel.pipeline.session_store.base.SessionStore.commit_turn>`), so whoever reads the
  reply finds the session free of it.

Open turns that are never closed (a message lost with its broker) stop counting after
``stale_after`` seconds, so a session cannot stay busy forever.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from agentkernel.core.log_limit import RateLimitedLog

__all__ = ["InMemoryTurnSignals", "Stop", "StopKind", "TurnSignals", "close_quietly"]

logger = logging.getLogger(__name__)
_log = RateLimitedLog(logger)

#: Seconds an open turn that was never closed still counts as open (a session is not busy
#: forever because one turn's message was lost).
STALE_AFTER_SECONDS = 900.0


class StopKind(StrEnum):
    """Why a turn is asked to stop."""

    #: A caller cancelled it: it never runs, or its run is cancelled; its state is not committed.
    CANCEL = "cancel"
    #: A later turn interrupts it: cancelled, keeping the state its agent had written so far.
    INTERRUPT = "interrupt"
    #: A later turn rolls it back: cancelled, and nothing of it is committed.
    ROLLBACK = "rollback"
    #: A later turn replaces it before it started (``coalesce``); refused once it has started.
    SUPERSEDE = "supersede"


@dataclass(frozen=True)
class Stop:
    """A request to stop one turn.

    Attributes:
        kind: why.
        by: the request id of the turn that asked (``interrupt``, ``rollback``, ``coalesce``).
    """

    kind: StopKind
    by: str | None = None

    @property
    def keeps_state(self) -> bool:
        """Whether the stopped turn's state is committed as its agent left it."""
        return self.kind is StopKind.INTERRUPT

    def encode(self) -> str:
        return json.dumps({"kind": self.kind.value, "by": self.by})

    @classmethod
    def decode(cls, text: str | bytes) -> Stop:
        data = json.loads(text)
        by = data.get("by")
        return cls(StopKind(data["kind"]), None if by is None else str(by))


class TurnSignals(ABC):
    """Open turns per session and stop requests per turn. Calls are blocking and thread-safe.

    ``key`` is always the session's store key (its id scoped by its owner,
    :func:`~agentkernel.pipeline.wire.scoping.session_key`), the same as the turn's message group.

    Args:
        ttl: seconds a stop request is kept (a stopped turn still queued past it would run).
        stale_after: seconds an open turn that was never closed keeps counting as open.
    """

    #: Calls never wait on I/O, so event-loop code may call them inline.
    nonblocking: ClassVar[bool] = False

    def __init__(self, ttl: float = 86400.0, stale_after: float = STALE_AFTER_SECONDS) -> None:
        self.ttl, self.stale_after = ttl, stale_after

    @abstractmethod
    def open(self, key: str, request_id: str, *, exclusive: bool = False) -> list[str]:
        """Count ``request_id`` as an open turn of the session stored at ``key``.

        Opening a turn that is already open changes nothing (a retried request).

        Args:
            exclusive: open it only when no other turn of the session is open.

        Returns:
            the session's other open turns, oldest first (with ``exclusive``, a non-empty list
            means ``request_id`` was not opened).
        """

    @abstractmethod
    def stop(self, key: str, request_id: str, stop: Stop) -> Stop | None:
        """Ask turn ``request_id`` of the session at ``key`` to stop; the first stop holds.

        Returns:
            the stop that holds for the turn now, or ``None`` when a ``SUPERSEDE`` was refused
            because the turn has started.
        """

    @abstractmethod
    def start(self, key: str, request_id: str) -> Stop | None:
        """Mark turn ``request_id`` as started (a runner is about to run it), opening it if it
        was not open.

        Returns:
            the stop asked for it before, if any: then it must not run (and is not marked).
        """

    @abstractmethod
    def stops(self, request_ids: Collection[str]) -> dict[str, Stop]:
        """The stops asked for any of ``request_ids``, by request id."""

    @abstractmethod
    def close(self, key: str, request_id: str) -> None:
        """Turn ``request_id`` has ended: it no longer counts as open in its session."""

    @abstractmethod
    def forget_session(self, key: str) -> None:
        """Drop the session's open turns (the session is being erased)."""

    def listen(self, callback: Callable[[str, Stop], None]) -> bool:
        """Call ``callback(request_id, stop)`` (from any thread) whenever a stop is asked here,
        besides answering :meth:`stops`.

        Returns whether this backend does (the default: no; runners then only poll).
        """
        return False

    def ping(self) -> None:  # noqa: B027 - optional hook
        """Raise when the backend is unreachable."""


def close_quietly(signals: TurnSignals, key: str, request_id: str) -> None:
    """:meth:`TurnSignals.close`, logging a failure instead of raising it: a turn left open goes
    stale on its own, and its outcome stands (blocking)."""
    try:
        signals.close(key, request_id)
    except Exception as exc:
        _log.log(
            logging.WARNING,
            f"close:{type(exc).__name__}",
            "turn %s answered but could not be marked as ended: %s",
            request_id,
            exc,
        )


class InMemoryTurnSignals(TurnSignals):
    """Turn signals of this process only (the embedded topology, tests)."""

    nonblocking = True

    def __init__(self, ttl: float = 86400.0, stale_after: float = STALE_AFTER_SECONDS) -> None:
        super().__init__(ttl, stale_after)
        # key -> request id -> [opened at, started]
        self._open: dict[str, dict[str, list[Any]]] = {}
        self._stops: dict[str, tuple[float, Stop]] = {}  # request id -> (expiry, stop)
        self._lock = threading.Lock()
        self._calls = 0
        self._listeners: list[Callable[[str, Stop], None]] = []

    def listen(self, callback: Callable[[str, Stop], None]) -> bool:
        self._listeners.append(callback)
        return True

    def open(self, key: str, request_id: str, *, exclusive: bool = False) -> list[str]:
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            turns = self._live(key, now)
            others = [rid for rid in turns if rid != request_id]
            if not (exclusive and others):
                turns.setdefault(request_id, [now, False])
                self._open[key] = turns
            return others

    def stop(self, key: str, request_id: str, stop: Stop) -> Stop | None:
        now = time.monotonic()
        with self._lock:
            held = self._live_stop(request_id, now)
            if held is not None:
                return held
            entry = self._live(key, now).get(request_id)
            if stop.kind is StopKind.SUPERSEDE and entry is not None and entry[1]:
                return None
            self._stops[request_id] = (now + self.ttl, stop)
        for listener in self._listeners:
            listener(request_id, stop)
        return stop

    def start(self, key: str, request_id: str) -> Stop | None:
        now = time.monotonic()
        with self._lock:
            held = self._live_stop(request_id, now)
            if held is None:
                turns = self._live(key, now)
                turns.setdefault(request_id, [now, True])[1] = True
                self._open[key] = turns
            return held

    def stops(self, request_ids: Collection[str]) -> dict[str, Stop]:
        now = time.monotonic()
        with self._lock:
            found = {rid: self._live_stop(rid, now) for rid in request_ids}
        return {rid: stop for rid, stop in found.items() if stop is not None}

    def close(self, key: str, request_id: str) -> None:
        with self._lock:
            turns = self._open.get(key)
            if turns is not None:
                turns.pop(request_id, None)
                if not turns:
                    del self._open[key]

    def forget_session(self, key: str) -> None:
        with self._lock:
            self._open.pop(key, None)

    def _live(self, key: str, now: float) -> dict[str, list[Any]]:
        """The open turns of ``key`` that are not stale, oldest first (a new dict)."""
        stale = now - self.stale_after
        turns = self._open.get(key, {})
        return {rid: entry for rid, entry in turns.items() if entry[0] > stale}

    def _live_stop(self, request_id: str, now: float) -> Stop | None:
        entry = self._stops.get(request_id)
        return entry[1] if entry is not None and entry[0] > now else None

    def _sweep(self, now: float) -> None:
        """Every so often, drop expired stops and stale open turns (bounded memory)."""
        self._calls += 1
        if self._calls % 1024:
            return
        self._stops = {rid: entry for rid, entry in self._stops.items() if entry[0] > now}
        for key in list(self._open):
            if not (turns := self._live(key, now)):
                del self._open[key]
            else:
                self._open[key] = turns
