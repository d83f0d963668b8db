"""The one header a NATS message carries its group id and attributes in, and the message a
received NATS message stands for.

Base64-encoded JSON, because NATS trims spaces from header values.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from agentkernel.pipeline.wire.envelope import QueueMessage
from agentkernel.pipeline.wire.position import Position

ENVELOPE_HEADER = "Ak-Envelope"


def encode_envelope(message: QueueMessage) -> str:
    doc = {"g": message.group_id, "a": message.attributes}
    return base64.b64encode(json.dumps(doc).encode()).decode()


def decode_envelope(header: str | None) -> tuple[str | None, dict[str, str]]:
    """The group id and attributes an envelope header carries (none without a header).

    Raises:
        ValueError: the header is not base64 of a JSON object with a string ``g`` and a
            string-to-string ``a``: not written by this package.
    """
    if not header:
        return None, {}
    try:
        doc = json.loads(base64.b64decode(header, validate=True))
    except (binascii.Error, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"{ENVELOPE_HEADER} header is not base64 JSON ({exc})") from exc
    group = doc.get("g") if isinstance(doc, dict) else None
    attributes = doc.get("a") or {} if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not (group is None or isinstance(group, str)):
        raise ValueError(f"{ENVELOPE_HEADER} header has no valid group")
    if not isinstance(attributes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()
    ):
        raise ValueError(f"{ENVELOPE_HEADER} header has attributes that are not strings")
    return group, attributes


def received_message(msg: Any, stream: str, unit: str) -> QueueMessage:
    """The message a JetStream delivery stands for; one that cannot be decoded comes out marked
    ``undecodable``, with what could be read, so the fetch goes on and the handling
    dead-letters it."""
    headers, meta, defects = msg.headers or {}, msg.metadata, []
    try:
        group, attributes = decode_envelope(headers.get(ENVELOPE_HEADER))
    except ValueError as exc:
        group, attributes = None, {}
        defects.append(str(exc))
    try:
        body = msg.data.decode()
    except UnicodeDecodeError:
        body = ""
        defects.append("body is not UTF-8")
    return QueueMessage(
        body=body,
        attributes=attributes,
        group_id=group,
        dedup_id=headers.get("Nats-Msg-Id"),
        receive_count=int(meta.num_delivered),
        message_id=f"{stream}:{meta.sequence.stream}",
        position=Position(unit, int(meta.sequence.stream), _stored(meta)),
        undecodable="; ".join(defects) or None,
        native=msg,
    )


def _stored(meta: Any) -> float | None:
    """When the server stored the message, in epoch seconds (``None`` if it did not say)."""
    stamp = getattr(meta, "timestamp", None)
    return None if stamp is None else float(stamp.timestamp())
