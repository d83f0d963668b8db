"""What a webhook receiver needs: ``verify_signature`` and the header names.

Example (any web framework; ``raw`` is the request body exactly as received)::

    from agentkernel.webhooks import SIGNATURE_HEADER, verify_signature

    verify_signature(raw, headers[SIGNATURE_HEADER], secret)  # raises WebhookSignatureError
"""

from agentkernel.pipeline.webhooks.signing import (
    ATTEMPT_HEADER,
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookSignatureError,
    verify_signature,
)

__all__ = [
    "ATTEMPT_HEADER",
    "ID_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "WebhookSignatureError",
    "verify_signature",
]
