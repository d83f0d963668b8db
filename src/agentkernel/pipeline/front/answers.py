"""What the chat front takes from an adapter and gives back: calls, answers, and a turn's address.

Plain data, so every adapter (FastAPI, WebSocket, Lambda) translates the same shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.wire.chat import HTTPError, poll_location
from agentkernel.pipeline.wire.records import ResponseRecord

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

    @property
    def ids(self) -> dict[str, str]:
        """The turn's ids, as error documents carry them."""
        return {"request_id": self.request_id, "session_id": self.session_id}

    def error(self, status: int, code: str, message: str) -> HTTPError:
        """An error answer that says where to poll for this turn's reply."""
        headers = {"Location": self.location}
        if status == 503:
            headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return HTTPError(status, code, message, headers, **self.ids)


def record_answer(
    record: ResponseRecord,
    session_id: str,
    owner: str | None,
    request_id: str | None = None,
    location: str | None = None,
) -> Answer:
    """The answer a stored reply stands for, if ``owner`` may see it under ``session_id``.

    Raises:
        HTTPError: 404 ``NOT_FOUND`` otherwise.
    """
    if not record.visible_to(session_id, owner):
        raise HTTPError(
            404,
            "NOT_FOUND",
            "no reply for this request in this session (yet)",
            request_id=request_id or "",
            session_id=session_id,
        )
    METRICS.inc("agentkernel_http_requests_total", status=str(record.status_code))
    headers = {"Content-Location": location} if location else {}
    return Answer(record.status_code, record.body, headers)


def accepted(turn: TurnAddress) -> Answer:
    """202: the turn is on the queue; poll its ``Location``."""
    METRICS.inc("agentkernel_http_requests_total", status="202")
    doc = {"status": "ACCEPTED", "request_id": turn.request_id, "session_id": turn.session_id}
    headers = {"Location": turn.location, "Preference-Applied": "respond-async"}
    return Answer(202, doc, headers)
