"""Cancels across processes: an IO process asks, a runner process stops the turn, the turn
signals kept in a shared session store (Redis, PostgreSQL) carrying the request between them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from tests.e2e.deployment import Deployment
from tests.e2e.test_postgres import postgres_env, schema
from tests.e2e.test_redis import redis_env
from tests.transports.test_redis_streams import drop_keys
from tests.turn_control.helpers import cancel, reply

__all__ = ["schema"]  # the fixture, used by name

pytestmark = pytest.mark.slow


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def split(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        made = Deployment({})
        made.env |= redis_env(url, made.tag)
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        made = Deployment(postgres_env(dsn, request.getfixturevalue("schema")))
    made.start_io()
    yield made
    made.close()
    if request.param == "redis":
        drop_keys(url, f"e2e:{made.tag}:")


def wait_ran(d: Deployment, request_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while request_id not in d.runs():
        assert time.monotonic() < deadline, f"turn {request_id} did not start"
        time.sleep(0.05)


def test_a_cancel_reaches_the_runner_process(split: Deployment) -> None:
    d, session = split, f"c-{uuid.uuid4().hex[:8]}"
    d.runner()
    running = d.post(session, "long", asynchronous=True, seconds=30).json()["request_id"]
    wait_ran(d, running)
    queued = d.post(session, "queued", asynchronous=True, seconds=30).json()["request_id"]
    busy = d.post(session, "refused", multitask_strategy="reject")
    assert busy.status_code == 409 and busy.json()["error"] == "SESSION_BUSY", busy.text
    asked = cancel(d.client, session, queued)  # queued behind a 30 s turn: not answered yet
    assert asked.status_code == 202 and asked.json()["status"] == "CANCEL_REQUESTED", asked.text
    answer = cancel(d.client, session, running)  # answered once the runner has stopped it
    assert answer.status_code == 200 and answer.json()["status"] == "CANCELLED", answer.text
    assert reply(d.client, session, queued).json()["error"] == "CANCELLED"
    assert queued not in d.runs()  # stopped before it started: never ran
    after = d.post(session, "next", multitask_strategy="reject", seconds=0)
    assert after.status_code == 200, after.text  # both closed: the session is idle again
