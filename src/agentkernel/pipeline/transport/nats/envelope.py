"""The one header a NATS message carries its group id and attributes in.

Base64-encoded JSON, because NATS trims spaces from header values.
"""

from __future__ import annotations

import base64
import binascii
import json

from agentkernel.pipeline.envelope import QueueMessage

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
