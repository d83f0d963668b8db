"""Last-attempt isolation, the Agent Runner's side: which delivery runs alone, and its trial mark.

The rule itself is in :mod:`agentkernel.pipeline.consumer.isolation`. The runner asks
:class:`LastAttempt` whether a delivery runs alone and notes the start of that run in the session
record (its ``trial`` marker), so a turn whose deliveries were all used up by crashes beside it
still gets its run alone from the permanent-failure hook.
"""

from __future__ import annotations

import functools

from agentkernel.core.blocking import call
from agentkernel.pipeline.consumer.isolation import is_suspect
from agentkernel.pipeline.session_store import SessionRecord, SessionStore
from agentkernel.pipeline.wire.envelope import QueueMessage


class LastAttempt:
    """The isolation rule of one queue: which deliveries run alone.

    Args:
        enabled: isolation is on (``execution.runner.isolate_last_attempt``).
        max_receive_count: deliveries allowed before the permanent-failure hook.
    """

    def __init__(self, enabled: bool, max_receive_count: int) -> None:
        self.enabled, self.max_receive_count = enabled, max_receive_count

    def runs_alone(self, message: QueueMessage) -> bool:
        """Whether this delivery of ``message`` runs alone in the process."""
        return self.enabled and is_suspect(message, self.max_receive_count)

    def owed_a_run(self, message: QueueMessage, record: SessionRecord, request_id: str) -> bool:
        """Whether a turn past its deliveries never had its run alone (crashes beside it)."""
        return self.runs_alone(message) and record.trial != request_id

    async def start_trial(
        self, sessions: SessionStore, session_id: str, record: SessionRecord, request_id: str
    ) -> SessionRecord:
        """Note in the session record that the turn's run alone has begun; returns the record."""
        trial = record.on_trial(request_id)
        write = functools.partial(sessions.write, expected_version=record.version)
        await call(sessions.nonblocking, write, session_id, trial)
        return trial
