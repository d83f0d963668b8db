"""Completion webhooks: the URL checks, the signature, and background delivery.

See docs/turn-control.md, "Completion webhooks". A receiver needs only
:func:`~agentkernel.pipeline.webhooks.signing.verify_signature` (also importable from
``agentkernel.webhooks``).
"""

from agentkernel.pipeline.webhooks.signing import (
    ATTEMPT_HEADER,
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookSignatureError,
    sign,
    verify_signature,
)

__all__ = [
    "ATTEMPT_HEADER",
    "ID_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "WebhookSignatureError",
    "sign",
    "verify_signature",
]
