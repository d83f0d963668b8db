"""redact_url keeps credentials out of names, logs and errors."""

from __future__ import annotations

import pytest

from agentkernel.core.redact import redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://ak:s3cret@host:4222", "nats://ak:***@host:4222"),
        ("nats://tok3n@host:4222", "nats://***@host:4222"),
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("rediss://user:p%40ss@h/1?ssl_cert_reqs=none", "rediss://user:***@h/1?ssl_cert_reqs=none"),
        ("https://h/q?token=s3cret&x=1", "https://h/q?token=***&x=1"),
        (
            "nats://a:s3cret@h1:4222,nats://b:s3cret@h2:4222",
            "nats://a:***@h1:4222,nats://b:***@h2:4222",
        ),
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("nats://ak:pa,ss@h:4222", "nats://ak:***@h:4222"),
        (
            "https://sqs.eu-west-1.amazonaws.com/123/q.fifo",
            "https://sqs.eu-west-1.amazonaws.com/123/q.fifo",
        ),
        ("Error('nats://ak:s3cret@h:1 refused')", "Error('nats://ak:***@h:1 refused')"),
    ],
)
def test_credentials_are_masked_and_the_rest_kept(url: str, shown: str) -> None:
    assert redact_url(url) == shown
