"""The one header a NATS message carries its group id and attributes in.

Base64-encoded JSON, because NATS trims spaces from header values.
"""

from __future__ import annotations

import base64
import json

from agentkernel.pipeline.envelope import QueueMessage

ENVELOPE_HEADER = "Ak-Envelope"


def encode_envelope(message: QueueMessage) -> str:
    doc = {"g": message.group_id, "a": message.attributes}
    return base64.b64encode(json.dumps(doc).encode()).decode()


def decode_envelope(header: str | None) -> tuple[str | None, dict[str, str]]:
    if not header:
        return None, {}
    doc = json.loads(base64.b64decode(header))
    return doc.get("g"), dict(doc.get("a") or {})
