from __future__ import annotations

from agentkernel.pipeline.turn_control import InMemoryTurnSignals, TurnSignals
from agentkernel.pipeline.turn_control.testing import TurnSignalsContract


class TestInMemoryTurnSignals(TurnSignalsContract):
    def make_signals(self, ttl: float = 60.0, stale_after: float = 60.0) -> TurnSignals:
        return InMemoryTurnSignals(ttl=ttl, stale_after=stale_after)
