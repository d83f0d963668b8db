"""The final answers of stopped turns: ``CANCELLED`` and ``SUPERSEDED``.

Both are error documents with status 409 (the turn conflicted with a later decision about its
session), so every caller waiting on the turn (sync, SSE, WebSocket, a poll, a webhook) gets a
final outcome of the usual shape and never a hang.
"""

from __future__ import annotations

from typing import Any

from agentkernel.pipeline.turn_control.signals import Stop, StopKind
from agentkernel.pipeline.wire.replies import error_doc

__all__ = ["CANCELLED", "STOPPED_CODES", "STOPPED_STATUS", "SUPERSEDED", "stopped_doc"]

CANCELLED = "CANCELLED"
SUPERSEDED = "SUPERSEDED"
#: The error codes of a turn that was stopped rather than run to its end.
STOPPED_CODES = frozenset({CANCELLED, SUPERSEDED})
#: The status of their replies.
STOPPED_STATUS = 409


def stopped_doc(stop: Stop, session_id: str, request_id: str) -> tuple[int, dict[str, Any]]:
    """The status and body of the reply of a turn that ``stop`` ended."""
    if stop.kind is StopKind.SUPERSEDE:
        text = f"replaced by turn {stop.by} before it started (multitask strategy 'coalesce')"
        doc = error_doc(SUPERSEDED, text, session_id, request_id)
        return STOPPED_STATUS, doc | {"superseded_by": stop.by}
    if stop.kind is StopKind.INTERRUPT:
        text = f"interrupted by turn {stop.by}; the session state it had written is kept"
    elif stop.kind is StopKind.ROLLBACK:
        text = f"rolled back by turn {stop.by}; nothing of it was kept"
    else:
        text = "cancelled on request; nothing of it was kept"
    doc = error_doc(CANCELLED, text, session_id, request_id) | {"reason": stop.kind.value}
    if stop.by is not None:
        doc["cancelled_by"] = stop.by
    return STOPPED_STATUS, doc
