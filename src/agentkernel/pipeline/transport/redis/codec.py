"""How a message is laid out in a session stream entry, and the message an entry stands for.

An entry has the fields ``n`` (the message's number in its queue, from the queue's counter:
its position), ``b`` (the body, UTF-8), ``a`` (the attributes, a JSON object of strings,
ASCII-escaped so any string survives byte for byte), ``d`` (the dedup id, when given) and
``u`` (set when the message had no group: its session is a one-off).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentkernel.pipeline.wire.envelope import QueueMessage
from agentkernel.pipeline.wire.position import Position


@dataclass(frozen=True, slots=True)
class Handle:
    """What settling a delivered message needs: its token, the delivery (the group member it
    went to and its count) and the session's head entry."""

    token: bytes
    count: int
    head: bytes
    session: bytes
    consumer: str


def encode_attributes(attributes: dict[str, str]) -> str:
    return json.dumps(attributes, ensure_ascii=True, separators=(",", ":"))


def sequence(raw: bytes | None) -> int | None:
    """The queue-wide number ``send`` gave a message (field ``n``); ``None`` for an entry
    another client wrote without one."""
    return int(raw) if raw is not None and raw.isdigit() else None


def decoded(name: str, unit: str, handle: Handle, fields: dict[bytes, bytes]) -> QueueMessage:
    """The message a session stream entry stands for; one that cannot be decoded comes out
    marked ``undecodable``, with what could be read, so the fetch goes on and the handling
    dead-letters it."""
    defects: list[str] = []
    body = _text(fields.get(b"b"), "body", defects)
    attributes = _attributes(fields.get(b"a"), defects)
    group: str | None = None
    if b"u" not in fields:
        group = _text(handle.session, "session id", defects)
    dedup, number = fields.get(b"d"), sequence(fields.get(b"n"))
    entry = handle.head.decode("ascii", "replace")
    return QueueMessage(
        body=body,
        attributes=attributes,
        group_id=group,
        dedup_id=dedup.decode("utf-8", "replace") if dedup is not None else None,
        receive_count=handle.count,
        message_id=f"{name}:{number}" if number is not None else f"{name}:entry-{entry}",
        position=Position(unit, number) if number is not None else None,
        undecodable="; ".join(defects) or None,
        native=handle,
    )


def _text(raw: bytes | None, what: str, defects: list[str]) -> str:
    if raw is None:
        defects.append(f"no {what}")
        return ""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        defects.append(f"{what} is not UTF-8")
        return ""


def _attributes(raw: bytes | None, defects: list[str]) -> dict[str, str]:
    if raw is None:
        return {}
    try:
        doc: Any = json.loads(raw)
    except ValueError:  # UnicodeDecodeError is a ValueError
        defects.append("attributes are not JSON")
        return {}
    if not isinstance(doc, dict):
        defects.append("attributes are not a JSON object")
        return {}
    kept = {k: v for k, v in doc.items() if isinstance(v, str)}
    if len(kept) != len(doc):
        defects.append("attributes that are not strings")
    return kept
