"""What the chat front takes from an adapter and gives back: calls, answers, and a turn's address.

Plain data, so every adapter (FastAPI, WebSocket, Lambda) translates the same shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentkernel.pipeline.chat import HTTPError, poll_location

#: Seconds a client is told to wait before retrying a 503.
RETRY_AFTER_SECONDS = 1


@dataclass(frozen=True)
class Answer:
    """What the front answers: an HTTP status, a JSON document and headers."""

    status: int
    doc: Any
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, exc: HTTPError) -> Answer:
        """The answer an error stands for."""
        return cls(exc.status, exc.doc, dict(exc.headers))


@dataclass(frozen=True)
class StreamAnswer:
    """A streamed turn to send as frames (see :meth:`ChatFront.frames`)."""

    request_id: str
    session_id: str
    after: int = -1
    owner: str | None = None


@dataclass(frozen=True)
class ChatCall:
    """A chat POST as an adapter read it.

    Args:
        body: the raw body (the adapter enforces its own transfer limits; the front checks size).
        identity: the authenticated caller, or ``None``.
        idempotency_key: the ``Idempotency-Key`` header.
        prefer: the ``Prefer`` header.
        traceparent: the ``traceparent`` header.
        stream: the caller asked for an event stream (``Accept: text/event-stream``).
        budget: longest sync wait this adapter can afford, in seconds (Lambda: its time left).
    """

    body: bytes
    identity: str | None = None
    idempotency_key: str | None = None
    prefer: str = ""
    traceparent: str = ""
    stream: bool = False
    budget: float | None = None


class TurnAddress:
    """What a POST knows about the turn it enqueued: enough for the client to find it again."""

    def __init__(self, session_id: str, request_id: str) -> None:
        self.session_id, self.request_id = session_id, request_id

    @property
    def location(self) -> str:
        return poll_location(self.session_id, self.request_id)

    def error(self, status: int, code: str, message: str) -> HTTPError:
        """An error answer that says where to poll for this turn's reply."""
        headers = {"Location": self.location}
        if status == 503:
            headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        ids = {"request_id": self.request_id, "session_id": self.session_id}
        return HTTPError(status, code, message, headers, **ids)
