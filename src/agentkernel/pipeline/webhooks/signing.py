"""Signing webhooks, and the helper a receiver verifies them with.

Every POST carries ``AgentKernel-Signature: t=<unix seconds>,v1=<hex>``, where the hex is the
HMAC-SHA256, under the configured ``api.webhooks.secret``, of the timestamp, a dot and the raw
request body: ``f"{t}.".encode() + body``. A receiver recomputes it over the bytes it received
(before parsing them), compares in constant time, and refuses a timestamp too far from its own
clock, so a captured request cannot be replayed later. Each attempt is signed afresh, so a
retry an hour into an outage still carries a current timestamp.
"""

from __future__ import annotations

import hashlib
import hmac
import time

#: The signature header: ``t=<unix seconds>,v1=<hex HMAC-SHA256>``.
SIGNATURE_HEADER = "AgentKernel-Signature"
#: The same timestamp on its own (unix seconds), for receivers that log it.
TIMESTAMP_HEADER = "AgentKernel-Timestamp"
#: The delivery's id: the same for every attempt and every redelivery of the same reply, so a
#: receiver keeps the first and drops the rest.
ID_HEADER = "AgentKernel-Webhook-Id"
#: 1 for the first attempt, 2 for the first retry, ...
ATTEMPT_HEADER = "AgentKernel-Webhook-Attempt"
#: Seconds a signature's timestamp may differ from the receiver's clock, by default.
DEFAULT_TOLERANCE_SECONDS = 300.0


class WebhookSignatureError(Exception):
    """A webhook whose signature does not verify: missing, malformed, wrong, or too old."""


def _key(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret


def _digest(secret: str | bytes, timestamp: int, body: bytes) -> str:
    signed = f"{timestamp}.".encode() + body
    return hmac.new(_key(secret), signed, hashlib.sha256).hexdigest()


def sign(body: bytes, secret: str | bytes, timestamp: int | None = None) -> str:
    """The ``AgentKernel-Signature`` value for ``body`` at ``timestamp`` (default: now)."""
    when = int(time.time()) if timestamp is None else timestamp
    return f"t={when},v1={_digest(secret, when, body)}"


def verify_signature(
    body: bytes,
    header: str | None,
    secret: str | bytes,
    *,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> int:
    """Check a webhook's ``AgentKernel-Signature`` header against the raw body received.

    Args:
        body: the request body exactly as received, before any JSON parsing.
        header: the ``AgentKernel-Signature`` header's value.
        secret: the shared secret (``api.webhooks.secret``).
        tolerance: seconds the signed timestamp may be away from ``now``.
        now: the receiver's clock in unix seconds (default: ``time.time()``).

    Returns:
        the signed timestamp (unix seconds).

    Raises:
        WebhookSignatureError: the header is missing or malformed, no ``v1`` signature in it
            matches, or its timestamp is outside ``tolerance``.
    """
    timestamp, signatures = _parse(header)
    clock = time.time() if now is None else now
    if abs(clock - timestamp) > tolerance:
        raise WebhookSignatureError(f"timestamp {timestamp} is outside the {tolerance}s tolerance")
    expected = _digest(secret, timestamp, body)
    if not any(hmac.compare_digest(expected, given) for given in signatures):
        raise WebhookSignatureError("no v1 signature matches the body")
    return timestamp


def _parse(header: str | None) -> tuple[int, list[str]]:
    if not header:
        raise WebhookSignatureError(f"no {SIGNATURE_HEADER} header")
    timestamp: int | None = None
    signatures: list[str] = []
    for item in header.split(","):
        name, _, value = item.strip().partition("=")
        if name == "t" and value.isdigit() and len(value) <= 12:
            timestamp = int(value)
        elif name == "v1" and value:
            signatures.append(value)
    if timestamp is None or not signatures:
        raise WebhookSignatureError(f"malformed {SIGNATURE_HEADER} header")
    return timestamp, signatures
