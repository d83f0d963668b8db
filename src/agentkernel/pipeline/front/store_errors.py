"""What a caller is told when a store fails: one status and code per kind of failure.

======================  ======  ==================================================================
failure                 status  code
======================  ======  ==================================================================
unreachable             503     ``STORE_UNAVAILABLE`` (retry, or poll the ``Location``)
full, refusing writes   503     ``STORE_FULL`` (Redis at ``maxmemory`` with ``noeviction``)
lost its data           503     ``STORE_DATA_LOST`` (the turn was refused, not run from nothing)
anything else           500     ``STORE_ERROR``
======================  ======  ==================================================================
"""

from __future__ import annotations

from agentkernel.core.errors import (
    StoreDataLostError,
    StoreError,
    StoreFullError,
    StoreUnavailableError,
)
from agentkernel.pipeline.front.answers import TurnAddress
from agentkernel.pipeline.wire.chat import HTTPError

__all__ = ["DATA_LOST", "store_error"]

#: What a caller is told when a store lost data this process relied on.
DATA_LOST = (
    "the store lost its data (emptied, or restarted without persistence): this turn was not "
    "run rather than answered from an empty session; an operator must restore the data or "
    "restart the service"
)


def store_error(turn: TurnAddress, exc: StoreError) -> HTTPError:
    """The answer to a request about ``turn`` that failed on the store with ``exc``."""
    if isinstance(exc, StoreDataLostError):
        return turn.error(503, "STORE_DATA_LOST", DATA_LOST)
    if isinstance(exc, StoreFullError):
        return turn.error(503, "STORE_FULL", "the reply store is full and refuses writes; retry")
    if isinstance(exc, StoreUnavailableError):
        message = "the reply store is unreachable; retry or poll the Location later"
        return turn.error(503, "STORE_UNAVAILABLE", message)
    return turn.error(500, "STORE_ERROR", "the reply store failed; poll the Location later")
