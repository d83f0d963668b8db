"""Where one queue's data lives in Redis.

Every key of a queue starts with the hash tag ``{<prefix><queue>}``, so a queue's keys share one
Redis Cluster slot and each script touches a single slot (INPUT and OUTPUT hash apart)::

    {ak:q:input}:ready          stream of session tokens, read by the consumer group
    {ak:q:input}:s:<session>    stream of the session's messages, oldest first
    {ak:q:input}:meta           hash: the queue's incarnation id and message counter
    {ak:q:input}:d:<dedup id>   marker of a dedup id, expiring after the dedup window
    {ak:q:input}:dlq            stream of dead letters
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueueKeys:
    """The keys of one queue.

    Attributes:
        name: the queue's readable name (``<prefix><queue>``), for logs and message ids.
        tag: ``{<name>}``, the prefix of every key of the queue.
    """

    name: str
    tag: str

    @classmethod
    def of(cls, prefix: str, queue: str) -> QueueKeys:
        name = f"{prefix}{queue}"
        return cls(name, "{" + name + "}")

    @property
    def ready(self) -> str:
        return f"{self.tag}:ready"

    @property
    def meta(self) -> str:
        return f"{self.tag}:meta"

    @property
    def dlq(self) -> str:
        return f"{self.tag}:dlq"

    def session(self, session: bytes) -> bytes:
        return f"{self.tag}:s:".encode() + session

    def dedup(self, dedup_id: bytes) -> bytes:
        return f"{self.tag}:d:".encode() + dedup_id
