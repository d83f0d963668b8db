"""Stream frames: what a streaming client sees, shared by SSE, WebSocket and the OUTPUT queue.

A streamed turn reaches its client as ``STREAM_CHUNK`` frames, one per chunk the agent yielded,
then one ``done`` frame carrying the joined result (or the error). The Agent Runner sends a chunk
as its own OUTPUT message when nothing else is on its way, and the chunks yielded meanwhile
together in the next one (:func:`chunk_batch`); the message's ``chunk_index`` attribute names the
indexes it carries, ``"4"`` or ``"5-9"``, and so does its dedup id (``<request_id>:<span>``), so
a redelivered turn cannot show a chunk twice. The response handler keeps each chunk in the
response store (:func:`chunk_frames` reads a message back into frames); the HTTP front reads
them from there, live or from an index on (resume).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from agentkernel.core.blocking import call
from agentkernel.pipeline.response_store.base import ResponseStore
from agentkernel.pipeline.wire.records import ResponseRecord, visible

STREAM_CHUNK = "STREAM_CHUNK"


def chunk_frame(request_id: str, session_id: str, index: int, delta: str) -> dict[str, Any]:
    """One chunk of a streamed reply."""
    return {
        "type": STREAM_CHUNK,
        "request_id": request_id,
        "session_id": session_id,
        "index": index,
        "delta": delta,
    }


def chunk_batch(request_id: str, session_id: str, first: int, deltas: list[str]) -> dict[str, Any]:
    """Consecutive chunks ``first``, ``first + 1``, ... of a streamed reply, as one OUTPUT body.

    Only the queue sees this shape: the response handler stores each delta as its own chunk
    frame, so clients see one frame per chunk whatever travelled together.
    """
    return {
        "type": STREAM_CHUNK,
        "request_id": request_id,
        "session_id": session_id,
        "index": first,
        "deltas": deltas,
    }


def chunk_span(first: int, count: int) -> str:
    """The ``chunk_index`` attribute of a message carrying ``count`` chunks from ``first`` on."""
    return str(first) if count == 1 else f"{first}-{first + count - 1}"


def chunk_frames(span: str, body: object) -> tuple[int, list[dict[str, Any]]] | None:
    """The index of the first chunk an OUTPUT chunk message carries and their frames, or
    ``None`` when the message is malformed.

    Args:
        span: its ``chunk_index`` attribute (:func:`chunk_span`).
        body: its decoded body (a chunk frame, or a :func:`chunk_batch` for a span).
    """
    first, _, last = span.partition("-")
    if not (first.isdigit() and isinstance(body, dict)):
        return None
    start = int(first)
    if not last:
        return start, [body]
    deltas, count = body.get("deltas"), int(last) - start + 1 if last.isdigit() else 0
    if not (count > 1 and isinstance(deltas, list) and len(deltas) == count):
        return None
    request_id, session_id = str(body.get("request_id", "")), str(body.get("session_id", ""))
    return start, [
        chunk_frame(request_id, session_id, start + offset, str(delta))
        for offset, delta in enumerate(deltas)
    ]


def done_frame(record: ResponseRecord) -> dict[str, Any]:
    """The last frame of a stream: the joined result (with the reply's ``attempt`` when it
    names one), or the error of a failed turn."""
    frame: dict[str, Any] = {
        "type": STREAM_CHUNK,
        "request_id": record.request_id,
        "session_id": record.session_id,
        "done": True,
    }
    if record.status_code == 200:
        frame["result"] = record.body.get("result", "")
        if "attempt" in record.body:  # a reply stored before attempts were reported has none
            frame["attempt"] = record.body["attempt"]
        return frame
    return frame | {
        "status_code": record.status_code,
        "error": record.body.get("error", "ERROR"),
        "message": record.body.get("message", ""),
    }


def error_frame(request_id: str, session_id: str, code: str, message: str) -> dict[str, Any]:
    """A ``done`` frame for a stream that ends without the turn's reply (timeout, not found)."""
    return {
        "type": STREAM_CHUNK,
        "request_id": request_id,
        "session_id": session_id,
        "done": True,
        "error": code,
        "message": message,
    }


async def read_frames(
    store: ResponseStore,
    request_id: str,
    session_id: str,
    *,
    after: int = -1,
    heartbeat: float = 15.0,
    idle_timeout: float = 60.0,
    owner: str | None = None,
) -> AsyncIterator[dict[str, Any] | None]:
    """The frames of a streamed turn from the store: chunks above ``after``, then ``done``.

    Yields ``None`` when ``heartbeat`` seconds pass without news (time for a keep-alive), and
    ends with an error frame after ``idle_timeout`` seconds without any. A frame of another
    session (or, with authentication, of another identity than ``owner``) ends the stream as
    not found: a reply is never readable under another session. So does a turn that nobody
    accepted, at once, where the store keeps tickets of accepted turns.
    """
    seen, quiet_since, first = after, time.monotonic(), True
    while True:
        record, chunks = await call(store.nonblocking, store.read_stream, request_id, seen)
        known = True
        if first and store.keeps_tickets:
            # Checked before the first byte: a foreign turn's chunks are never sent.
            ticket = await call(store.nonblocking, store.ticket, request_id)
            found = record is not None or bool(chunks)
            known = ticket.visible_to(session_id, owner) if ticket is not None else found
        if not known or (record is not None and not record.visible_to(session_id, owner)):
            yield _not_found(request_id, session_id)  # no such turn for this caller: say so
            return
        first = False
        for frame in chunks:
            if not visible(str(frame.get("session_id", "")), None, session_id, None):
                yield _not_found(request_id, session_id)
                return
            seen, quiet_since = int(frame["index"]), time.monotonic()
            yield frame
        if record is not None:
            yield done_frame(record)
            return
        if time.monotonic() - quiet_since >= idle_timeout:
            yield error_frame(request_id, session_id, "TIMEOUT", "no news of the turn in time")
            return
        if not await store.wait_change(request_id, heartbeat, seen):
            yield None


def _not_found(request_id: str, session_id: str) -> dict[str, Any]:
    return error_frame(request_id, session_id, "NOT_FOUND", "no such turn in this session")
