"""Redis only, end to end: IO process and runner processes on the Redis Streams transport, with
the Redis response store and session store on the same server."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from tests.e2e.deployment import Deployment, assert_in_order_and_exclusive, result
from tests.transports.test_redis_streams import drop_keys

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def redis_env(redis_url: str, tag: str) -> dict[str, str]:
    return {
        "AK_EXECUTION__QUEUES__TYPE": "redis",
        "AK_EXECUTION__QUEUES__REDIS__URL": redis_url,
        "AK_EXECUTION__QUEUES__REDIS__PREFIX": f"e2e:{tag}:q:",
        "AK_EXECUTION__QUEUES__REDIS__ACK_WAIT": "3",
        "AK_EXECUTION__QUEUES__REDIS__AUTO_PROVISION": "true",
        "AK_EXECUTION__QUEUES__INPUT__NO_OF_CONSUMERS": "2",
        "AK_EXECUTION__RESPONSE_STORE__TYPE": "redis",
        "AK_EXECUTION__RESPONSE_STORE__REDIS__URL": redis_url,
        "AK_EXECUTION__RESPONSE_STORE__REDIS__PREFIX": f"e2e:{tag}:r:",
        "AK_SESSION__TYPE": "redis",
        "AK_SESSION__REDIS__URL": redis_url,
        "AK_SESSION__REDIS__PREFIX": f"e2e:{tag}:s:",
    }


@pytest.fixture
def redis_deployment(redis_url: str) -> Iterator[Deployment]:
    deployment = Deployment({})
    deployment.env |= redis_env(redis_url, deployment.tag)
    deployment.start_io()
    yield deployment
    deployment.close()
    drop_keys(redis_url, f"e2e:{deployment.tag}:")


def test_sync_async_and_order_across_two_runners(redis_deployment: Deployment) -> None:
    d = redis_deployment
    d.runner()
    d.runner()
    assert result(d.post("solo", "0"))["prompt"] == "0"
    ids = {
        (s, i): d.post(s, str(i), asynchronous=True, seconds=0.1).json()["request_id"]
        for i in range(5)
        for s in ("a", "b", "c")
    }
    runs = {key: result(d.poll(key[0], rid)) for key, rid in ids.items()}
    for s in ("a", "b", "c"):
        assert_in_order_and_exclusive([runs[(s, i)] for i in range(5)])
    ran = [rid for rid in d.runs()[0::2] if rid in set(ids.values())]
    assert sorted(ran) == sorted(ids.values())  # each turn ran once


def test_kill_9_of_a_runner_redelivers_after_the_lease(redis_deployment: Deployment) -> None:
    d = redis_deployment
    victim = d.runner()
    time.sleep(2.0)
    request_id = d.post("k", "survive", asynchronous=True, seconds=2.0).json()["request_id"]
    deadline = time.monotonic() + 10
    while not d.runs() and time.monotonic() < deadline:
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    d.runner()
    answer = result(d.poll("k", request_id))
    assert (answer["prompt"], answer["attempt"]) == ("survive", 2)
    assert d.runs() == [request_id, "1", request_id, "2"]


def test_sigterm_of_a_runner_runs_every_accepted_turn_once(redis_url: str) -> None:
    d = Deployment({})
    d.env |= redis_env(redis_url, d.tag) | {"AK_EXECUTION__QUEUES__REDIS__ACK_WAIT": "30"}
    try:
        d.start_io()
        leaving = d.runner()
        # Alone, it takes the first turn: its signal handlers are set once it has run one.
        assert result(d.post("warm", "0"))["pid"] == leaving.pid
        d.runner()
        sessions = [f"s{i}" for i in range(8)]
        ids = {
            (s, i): d.post(s, str(i), asynchronous=True, seconds=0.3).json()["request_id"]
            for i in range(6)
            for s in sessions
        }
        deadline = time.monotonic() + 20
        while len(d.runs()) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        leaving.send_signal(signal.SIGTERM)  # a rolling deploy: drain, then a new runner
        assert leaving.wait(60) == 0
        d.runner()
        turns = {key: result(d.poll(key[0], rid, timeout=60)) for key, rid in ids.items()}
        for s in sessions:
            assert_in_order_and_exclusive([turns[(s, i)] for i in range(6)])
        ran = [rid for rid in d.runs()[0::2] if rid in set(ids.values())]
        assert sorted(ran) == sorted(ids.values())  # each turn ran once
        attempts = {key: turn["attempt"] for key, turn in turns.items()}
        assert set(attempts.values()) == {1}, attempts  # the drain ran what it held
    finally:
        d.close()
        drop_keys(redis_url, f"e2e:{d.tag}:")
