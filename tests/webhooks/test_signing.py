"""The webhook signature: what the sender writes and the public helper checks."""

from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path
from typing import Any

import pytest

from agentkernel.pipeline.webhooks.signing import sign
from agentkernel.webhooks import SIGNATURE_HEADER, WebhookSignatureError, verify_signature

BODY = b'{"request_id":"r1","status_code":200}'


def test_a_signature_verifies_and_returns_its_timestamp() -> None:
    header = sign(BODY, "s3cret", 1_700_000_000)
    assert verify_signature(BODY, header, "s3cret", now=1_700_000_100) == 1_700_000_000


def test_the_scheme_is_hmac_sha256_over_timestamp_dot_body() -> None:
    """What docs/turn-control.md tells receivers to compute without this package."""
    expected = hmac.new(b"s3cret", b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert sign(BODY, "s3cret", 1_700_000_000) == f"t=1700000000,v1={expected}"


@pytest.mark.parametrize(
    ("body", "header", "secret", "now"),
    [
        (BODY + b" ", None, "s3cret", 1_700_000_000),  # body changed
        (BODY, None, "other", 1_700_000_000),  # wrong secret
        (BODY, None, "s3cret", 1_700_000_301),  # too old
        (BODY, None, "s3cret", 1_699_999_699),  # from the future
        (BODY, "", "s3cret", 1_700_000_000),
        (BODY, "v1=abc", "s3cret", 1_700_000_000),
        (BODY, "t=1700000000", "s3cret", 1_700_000_000),
        (BODY, "t=abc,v1=abc", "s3cret", 1_700_000_000),
        (BODY, "t=1700000000,v1=" + "0" * 64, "s3cret", 1_700_000_000),
    ],
)
def test_bad_signatures_are_refused(
    body: bytes, header: str | None, secret: str, now: float
) -> None:
    signed = sign(BODY, "s3cret", 1_700_000_000) if header is None else header
    with pytest.raises(WebhookSignatureError):
        verify_signature(body, signed, secret, now=now)


def test_any_of_several_v1_signatures_may_match() -> None:
    good = sign(BODY, "s3cret", 1_700_000_000)
    mixed = f"t=1700000000,v1={'f' * 64},{good.split(',')[1]}"
    assert verify_signature(BODY, mixed, b"s3cret", now=1_700_000_000) == 1_700_000_000


def test_the_verification_snippets_of_the_docs_work() -> None:
    """Both receiver snippets of docs/turn-control.md accept a real signature, refuse a forgery."""
    text = (Path(__file__).parents[2] / "docs" / "turn-control.md").read_text()
    section = text[text.index("## Completion webhooks") :]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    scope: dict[str, Any] = {}
    for block in blocks:
        exec(block, scope)  # our own documentation
    header = sign(BODY, "s3cret")
    assert scope["handle"](BODY, {SIGNATURE_HEADER: header}, "s3cret")
    assert not scope["handle"](BODY + b"x", {SIGNATURE_HEADER: header}, "s3cret")
    assert not scope["handle"](BODY, {}, "s3cret")
    assert scope["verified"](BODY, header, "s3cret")
    assert not scope["verified"](BODY, header, "other")
    assert not scope["verified"](BODY, sign(BODY, "s3cret", 1_000), "s3cret")
