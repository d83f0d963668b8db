"""Server-Sent Events: a streamed turn as ``text/event-stream``.

Every event has an ``id:`` line (the chunk index; the ``done`` event's id is one past the last
chunk) and one ``data:`` line holding a JSON frame (see
:mod:`agentkernel.pipeline.response_store.frames`).
Comment lines keep an idle connection open through proxies. A client that disconnects only ends
its own stream: the turn completes and its reply stays readable; ``Last-Event-ID`` resumes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

MEDIA_TYPE = "text/event-stream"
KEEP_ALIVE = b": keep-alive\n\n"


def wants_stream(accept: str) -> bool:
    """Whether an ``Accept`` header asks for an event stream."""
    return any(part.split(";")[0].strip() == MEDIA_TYPE for part in accept.split(","))


def last_event_id(header: str | None) -> int:
    """The chunk index a resuming client has seen (-1: none, or a header that is no index)."""
    if header is None or not header.strip().isdigit():
        return -1
    return min(int(header), 1 << 31)


def event(frame: dict[str, Any], event_id: int) -> bytes:
    """One SSE event for ``frame``."""
    return f"id: {event_id}\ndata: {json.dumps(frame)}\n\n".encode()


async def events(frames: AsyncIterator[dict[str, Any] | None], after: int) -> AsyncIterator[bytes]:
    """Encode frames as SSE events; a ``None`` frame becomes a keep-alive comment."""
    last = after
    yield KEEP_ALIVE  # sends the headers at once, so the client knows the turn is queued
    async for frame in frames:
        if frame is None:
            yield KEEP_ALIVE
        elif frame.get("done"):
            yield event(frame, last + 1)
        else:
            last = int(frame["index"])
            yield event(frame, last)


def stream_response(
    frames: AsyncIterator[dict[str, Any] | None], request_id: str, after: int = -1
) -> StreamingResponse:
    """The ``200 text/event-stream`` answer sending ``frames`` of ``request_id``."""
    return StreamingResponse(
        events(frames, after),
        media_type=MEDIA_TYPE,
        headers={
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            "X-Request-Id": request_id,
        },
    )
