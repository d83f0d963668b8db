"""A POST refused with 503 while NATS was down can still run once the client reconnects (its
publish was buffered): the 503 carries the request id, so the caller can find out, and a retry
with the same Idempotency-Key never runs the turn a second time."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from httpx import Response

from tests.e2e.test_nats import PrivateNats, nats_env
from tests.e2e.test_turn_outcomes import AGENTS, Supervised

pytestmark = [pytest.mark.nats, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(240)]


def test_refused_posts_during_an_outage_are_resolvable(tmp_path: Path, redis_url: str) -> None:
    server = PrivateNats(tmp_path / "js")
    d = Supervised({}, redis_url)
    d.env |= nats_env(server.url, redis_url, d.tag) | {
        "AK_API__ENQUEUE_TIMEOUT": "2",
        "AK_EXECUTION__QUEUES__NATS__REQUEST_TIMEOUT": "2",
    }
    try:
        d.start_io()
        d.spawn("runner", str(AGENTS))
        assert _ask(d, "before").status_code == 200
        server.stop()
        plain = _ask(d, "plain")
        keyed = _ask(d, "keyed", key="k-1")
        assert (plain.status_code, keyed.status_code) == (503, 503), (plain.text, keyed.text)
        for refused in (plain, keyed):
            assert refused.json()["request_id"] and refused.headers["location"]
        server.start()
        retried = _ask(d, "keyed", key="k-1", retry_for=60)
        assert retried.status_code == 200, retried.text
        assert retried.json()["request_id"] == keyed.json()["request_id"]
        # the plain POST's fate is knowable: poll the request id it was answered with
        polled = d.poll("phantom", plain.json()["request_id"], timeout=30)
        ran_plain = polled.status_code == 200
        after = _ask(d, "after")
        seen = json.loads(after.json()["result"])
        assert seen.count("keyed") == 1, seen
        assert seen.count("plain") == (1 if ran_plain else 0), (seen, polled.text)
        assert seen[0] == "before" and seen[-1] == "after"
    finally:
        d.close()
        server.stop()


def _ask(d: Supervised, prompt: str, key: str | None = None, retry_for: float = 0) -> Response:
    """POST a turn; with ``retry_for``, retry a 503 with the same key as a client would."""
    headers = {"Idempotency-Key": key} if key else {}
    body = {"session_id": "phantom", "prompt": prompt, "agent": "remember", "seconds": 0.05}
    deadline = time.monotonic() + retry_for
    while True:
        response = d.client.post("/api/v1/chat", json=body, headers=headers)
        if response.status_code != 503 or time.monotonic() > deadline:
            return response
        time.sleep(0.5)
