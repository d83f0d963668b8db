"""A session store for the end-to-end tests that kills its process right after a commit."""

import os

from agentkernel.pipeline.session_store.redis import RedisSessionStore


class DieAfterCommit(RedisSessionStore):
    """A Redis session store whose process dies right after committing a ``die`` turn: the
    state and reply are stored but the reply is never sent and the message never acked."""

    def __init__(self) -> None:
        super().__init__(os.environ["E2E_REDIS_URL"], prefix=os.environ["E2E_PREFIX"])

    def write(self, session_id, record, *, expected_version):
        super().write(session_id, record, expected_version=expected_version)
        if record.last and record.state.get("seen", [])[-1:] == ["die"] and record.version == 1:
            os._exit(9)
