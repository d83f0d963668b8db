"""Session stores under their first import path (see :mod:`agentkernel.pipeline.session_store`)."""

from agentkernel.pipeline.session_store import (
    SessionRecord,
    SessionStore,
    TurnOutcome,
    create_session_store,
)

__all__ = ["SessionRecord", "SessionStore", "TurnOutcome", "create_session_store"]
