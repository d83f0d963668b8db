"""The runner's side of a stop: one poll of the turn signals for every turn a loop runs.

Each event loop that runs turns gets one polling task while it runs any: every
``interval`` seconds it asks :meth:`TurnSignals.stops` about all of its turns in one call and
resolves the future of each turn asked to stop. The task ends when the loop's last turn ends,
so an idle runner makes no calls. Signals that push their stops (:meth:`TurnSignals.listen`, the
in-memory ones of ``agentkernel serve``) reach the turn at once, the poll staying as a backstop.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from contextlib import AbstractAsyncContextManager

from agentkernel.core.blocking import call
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.turn_control.signals import Stop, TurnSignals

__all__ = ["StopWatcher"]

logger = logging.getLogger(__name__)


class _LoopTurns:
    """The turns one event loop runs, and its polling task."""

    def __init__(self) -> None:
        self.turns: dict[str, list[asyncio.Future[Stop]]] = {}
        self.task: asyncio.Task[None] | None = None


class StopWatcher:
    """Tells running turns they were asked to stop, within ``interval`` seconds.

    Args:
        signals: where stops are asked for.
        interval: seconds between two polls while a turn runs.
    """

    def __init__(self, signals: TurnSignals, interval: float = 0.25) -> None:
        self.signals, self.interval = signals, interval
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopTurns] = (
            weakref.WeakKeyDictionary()
        )
        self._log = RateLimitedLog(logger)
        signals.listen(self._pushed)

    def _pushed(self, request_id: str, stop: Stop) -> None:
        """A stop pushed by the signals, from any thread: resolved on each loop running it."""
        for loop, state in list(self._loops.items()):
            if request_id in state.turns and not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, state, request_id, stop)

    def watching(self, request_id: str) -> AbstractAsyncContextManager[asyncio.Future[Stop]]:
        """A future resolved with the turn's :class:`Stop` once one is asked, while inside."""
        return _Watching(self, request_id)

    def _open(self, request_id: str) -> tuple[_LoopTurns, asyncio.Future[Stop]]:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = self._loops[loop] = _LoopTurns()
        stopped: asyncio.Future[Stop] = loop.create_future()
        state.turns.setdefault(request_id, []).append(stopped)
        if state.task is None:
            state.task = loop.create_task(self._poll(state), name="turn-stop-watcher")
        return state, stopped

    async def _poll(self, state: _LoopTurns) -> None:
        try:
            while state.turns:
                await asyncio.sleep(self.interval)
                if not state.turns:
                    break
                try:
                    signals = self.signals
                    found = await call(signals.nonblocking, signals.stops, list(state.turns))
                except Exception as exc:  # the store is down: the turns run on meanwhile
                    self._log.log(
                        logging.WARNING,
                        f"stops:{type(exc).__name__}",
                        "cannot read cancellations of running turns: %s",
                        exc,
                    )
                    continue
                for request_id, stop in found.items():
                    _resolve(state, request_id, stop)
        finally:
            state.task = None


class _Watching:
    """:meth:`StopWatcher.watching` (a class: entered once per turn, cheaper than a generator)."""

    __slots__ = ("_request_id", "_state", "_stopped", "_watcher")

    def __init__(self, watcher: StopWatcher, request_id: str) -> None:
        self._watcher, self._request_id = watcher, request_id

    async def __aenter__(self) -> asyncio.Future[Stop]:
        self._state, self._stopped = self._watcher._open(self._request_id)
        return self._stopped

    async def __aexit__(self, *exc: object) -> None:
        futures = self._state.turns.get(self._request_id, [])
        if self._stopped in futures:
            futures.remove(self._stopped)
        if not futures:
            self._state.turns.pop(self._request_id, None)
        self._stopped.cancel()


def _resolve(state: _LoopTurns, request_id: str, stop: Stop) -> None:
    for stopped in state.turns.get(request_id, []):
        if not stopped.done():
            stopped.set_result(stop)
