"""``GET /ready``: whether this process can answer turns, and what an operator should know.

Each check (the broker, the response store and, in an embedded process, the session store) must
answer within ``READY_CHECK_SECONDS``. A store that is reachable but refuses writes (``full``) or
no longer holds the data this process started on (``data_lost``) fails readiness like one that is
down: no turn could be answered right. Warnings (Redis without persistence, eviction allowed)
leave readiness as it is and are listed beside the checks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from agentkernel.core.errors import StoreDataLostError, StoreFullError

__all__ = ["READY_CHECK_SECONDS", "CheckedStore", "readiness"]

#: Longest wait for a readiness check of the broker or a store, in seconds.
READY_CHECK_SECONDS = 5.0


class CheckedStore(Protocol):
    """A store readiness looks at: response and session stores alike."""

    def ping(self) -> None: ...

    def warnings(self) -> list[str]: ...


async def readiness(
    checks: Mapping[str, Callable[[], None]], warnings: list[str]
) -> tuple[int, dict[str, Any]]:
    """The status and document of ``/ready``: 200 when every check passes, else 503 naming the
    ones that failed and how."""
    results: dict[str, str] = {}
    for name, check in checks.items():
        try:
            await asyncio.wait_for(asyncio.to_thread(check), READY_CHECK_SECONDS)
            results[name] = "ok"
        except Exception as exc:
            results[name] = state_of(exc)
    notes = {"warnings": warnings} if warnings else {}
    if all(v == "ok" for v in results.values()):
        return 200, {"status": "ready", **results, **notes}
    down = ", ".join(f"{name} ({v})" for name, v in results.items() if v != "ok")
    doc = {"error": "NOT_READY", "message": f"not answering: {down}", "status": "not_ready"}
    return 503, doc | results | notes


def state_of(exc: BaseException) -> str:
    """How a failed check is reported (never the exception's text: ``/ready`` is open)."""
    if isinstance(exc, StoreDataLostError):
        return "data_lost"
    if isinstance(exc, StoreFullError):
        return "full"
    return f"unavailable: {type(exc).__name__}"
