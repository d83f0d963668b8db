"""What a new turn does to the turns of its session that are still queued or running.

``multitask_strategy`` in a chat request (default ``execution.turn_control.multitask_strategy``):

============  =============================================================================
enqueue       wait in line behind them (the default)
reject        refused with 409 ``SESSION_BUSY`` while another turn is queued or running
interrupt     cancel them, keeping the state a running one had written; run next
rollback      cancel them, keeping nothing of them; run next
coalesce      replace those that have not started (their callers get ``SUPERSEDED``); a
              running one finishes first
============  =============================================================================

The new turn is always enqueued behind the ones it stops: the session's order holds, and the
stopped turns end (``CANCELLED``, ``SUPERSEDED``) before it runs.
"""

from __future__ import annotations

from agentkernel.core.config.turns import MultitaskStrategy
from agentkernel.core.errors import StoreError
from agentkernel.pipeline.turn_control.signals import Stop, StopKind, TurnSignals
from agentkernel.pipeline.wire.chat import HTTPError

__all__ = ["MultitaskStrategy", "TurnOpening", "open_turn"]


_STOPS = {
    MultitaskStrategy.INTERRUPT: StopKind.INTERRUPT,
    MultitaskStrategy.ROLLBACK: StopKind.ROLLBACK,
    MultitaskStrategy.COALESCE: StopKind.SUPERSEDE,
}


def open_turn(
    signals: TurnSignals, key: str, request_id: str, strategy: MultitaskStrategy
) -> list[str]:
    """Open turn ``request_id`` of the session stored at ``key`` and apply ``strategy`` to the
    session's other open turns (blocking).

    Returns:
        the turns asked to stop (``SUPERSEDE`` refused by a turn that had started is left out).

    Raises:
        HTTPError: 409 ``SESSION_BUSY`` for ``reject`` while another turn is open.
    """
    exclusive = strategy is MultitaskStrategy.REJECT
    others = signals.open(key, request_id, exclusive=exclusive)
    if exclusive and others:
        raise HTTPError(
            409,
            "SESSION_BUSY",
            "another turn of this session is queued or running (multitask strategy 'reject'); "
            "retry once it has answered",
            {"Retry-After": "1"},
            request_id=request_id,
        )
    kind = _STOPS.get(strategy)
    if kind is None:
        return []
    stop = Stop(kind, by=request_id)
    return [rid for rid in others if signals.stop(key, rid, stop) == stop]


class TurnOpening:
    """:func:`open_turn` for one turn, split so that a front can run it in the same worker-thread
    call as the turn's ticket: :meth:`run` blocks and keeps what happened, :meth:`result` tells
    it on the event loop.

    Args:
        signals: the session store's turn signals.
        key: the session's store key.
        request_id: the turn to open.
        strategy: what it does to the session's other open turns.
    """

    def __init__(
        self, signals: TurnSignals, key: str, request_id: str, strategy: MultitaskStrategy
    ) -> None:
        self.signals, self.key, self.request_id, self.strategy = signals, key, request_id, strategy
        #: ``run`` never waits on I/O (in-process signals): it may run on the event loop.
        self.nonblocking = signals.nonblocking
        self._stopped: list[str] = []
        self._error: HTTPError | StoreError | None = None

    def run(self) -> None:
        """Open the turn (blocking); never raises what :meth:`result` re-raises."""
        try:
            self._stopped = open_turn(self.signals, self.key, self.request_id, self.strategy)
        except (HTTPError, StoreError) as exc:
            self._error = exc

    def result(self) -> list[str]:
        """The turns asked to stop, as :func:`open_turn` returns them.

        Raises:
            HTTPError: 409 ``SESSION_BUSY`` (``reject``).
            StoreError: the signals could not be reached.
        """
        if self._error is not None:
            raise self._error
        return self._stopped
