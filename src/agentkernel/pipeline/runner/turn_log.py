"""The one INFO line of each turn the Agent Runner ran, like a task queue's "succeeded in 0.2s".

    turn 3f2a... of session s1 (agent echo, attempt 1) succeeded in 0.204s
    turn 9c1b... of session s2 (agent echo, attempt 2) failed 500 AGENT_ERROR in 1.532s

A turn that asks to be retried (``RetryableError``) is one WARNING line of the message handling
instead, and a turn abandoned after its last delivery one ERROR line of the runner.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from agentkernel.core.agent import Turn

logger = logging.getLogger("agentkernel.turns")


def outcome_of(status: int, doc: Mapping[str, Any]) -> str:
    """``succeeded``, or ``failed <status> <error code>``."""
    if status < 400:
        return "succeeded"
    return f"failed {status} {doc.get('error', 'ERROR')}"


def turn_finished(turn: Turn, status: int, doc: Mapping[str, Any], seconds: float) -> None:
    """Log the turn's line: request id, session, agent, attempt, outcome and duration."""
    logger.info(
        "turn %s of session %s (agent %s, attempt %s) %s in %.3fs",
        turn.request_id,
        turn.session_id,
        turn.agent,
        turn.attempt,
        outcome_of(status, doc),
        seconds,
    )
