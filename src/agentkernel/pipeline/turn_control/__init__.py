"""Turn control: cancelling turns, multitask strategies, and the signals they travel by."""

from __future__ import annotations

from agentkernel.pipeline.turn_control.signals import (
    InMemoryTurnSignals,
    Stop,
    StopKind,
    TurnSignals,
)

__all__ = ["InMemoryTurnSignals", "Stop", "StopKind", "TurnSignals"]
