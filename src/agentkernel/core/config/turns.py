"""The configuration model of turn control (``execution.turn_control``)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from agentkernel.core.config.base import Block


class MultitaskStrategy(StrEnum):
    """What a new turn does to the turns of its session still queued or running
    (:mod:`agentkernel.pipeline.turn_control.strategies`)."""

    ENQUEUE = "enqueue"
    REJECT = "reject"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"
    COALESCE = "coalesce"


class TurnControlConfig(Block):
    """``execution.turn_control``: cancelling turns and what a second message does."""

    multitask_strategy: MultitaskStrategy = Field(
        MultitaskStrategy.ENQUEUE,
        description="Default for a chat request's multitask_strategy: enqueue (wait behind the "
        "session's unfinished turns), reject (409 SESSION_BUSY while one is queued or running), "
        "interrupt (cancel them, keeping the state a running one wrote), rollback (cancel them, "
        "keeping nothing), coalesce (replace those not started; their callers get SUPERSEDED).",
    )
    cancel_wait: float = Field(
        2.0,
        ge=0,
        le=60,
        description="Seconds POST .../cancel waits for the turn's final outcome before it "
        "answers 202 (cancel asked, not confirmed yet).",
    )
    poll_interval: float = Field(
        0.25,
        gt=0,
        le=5,
        description="Seconds between two checks of a runner for cancellations of the turns it "
        "runs (one store call for all of them; none while it runs nothing). A cancel reaches "
        "a running agent within about this long.",
    )
    stale_after: float = Field(
        900.0,
        gt=0,
        description="Seconds after which a turn accepted but never answered (its message lost) "
        "no longer counts as open for reject, interrupt, rollback and coalesce.",
    )
