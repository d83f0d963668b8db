"""Postgres only, end to end: an IO process and runner processes whose queues, replies and
sessions all live in one PostgreSQL schema, migrated beforehand (no auto_provision)."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from agentkernel.pipeline.postgres.schema import migrate
from tests.e2e.deployment import Deployment, assert_in_order_and_exclusive, result

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def postgres_env(dsn: str, schema: str) -> dict[str, str]:
    env = {
        "AK_EXECUTION__QUEUES__TYPE": "postgres",
        "AK_EXECUTION__QUEUES__POSTGRES__ACK_WAIT": "3",
        "AK_EXECUTION__QUEUES__INPUT__NO_OF_CONSUMERS": "2",
        "AK_EXECUTION__RESPONSE_STORE__TYPE": "postgres",
        "AK_SESSION__TYPE": "postgres",
    }
    for block in ("EXECUTION__QUEUES", "EXECUTION__RESPONSE_STORE", "SESSION"):
        env[f"AK_{block}__POSTGRES__DSN"] = dsn
        env[f"AK_{block}__POSTGRES__DB_SCHEMA"] = schema
    return env


@pytest.fixture
def schema(postgres_dsn: str) -> Iterator[str]:
    name = f"e2e_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        migrate(conn, name)
    yield name
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{name}" CASCADE')  # type: ignore[call-overload]


@pytest.fixture
def deployment(postgres_dsn: str, schema: str) -> Iterator[Deployment]:
    made = Deployment(postgres_env(postgres_dsn, schema))
    made.start_io()
    yield made
    made.close()


def test_sync_async_and_order_across_two_runners(deployment: Deployment) -> None:
    d = deployment
    d.runner()
    d.runner()
    assert result(d.post("solo", "0"))["prompt"] == "0"
    ids = {
        (s, i): d.post(s, str(i), asynchronous=True, seconds=0.1).json()["request_id"]
        for i in range(4)
        for s in ("a", "b", "c")
    }
    runs = {key: result(d.poll(key[0], rid)) for key, rid in ids.items()}
    for s in ("a", "b", "c"):
        assert_in_order_and_exclusive([runs[(s, i)] for i in range(4)])
    assert d.client.get("/ready").status_code == 200


def test_kill_9_of_a_runner_redelivers_after_the_lease(deployment: Deployment) -> None:
    d = deployment
    victim = d.runner()
    time.sleep(2.0)
    request_id = d.post("k", "survive", asynchronous=True, seconds=2.0).json()["request_id"]
    d.wait_started(request_id)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    d.runner()
    answer = result(d.poll("k", request_id))
    assert (answer["prompt"], answer["attempt"]) == ("survive", 2)
    assert d.runs() == [request_id, "1", request_id, "2"]


def test_sigterm_of_a_runner_runs_every_accepted_turn_once(postgres_dsn: str, schema: str) -> None:
    d = Deployment(postgres_env(postgres_dsn, schema))
    d.env["AK_EXECUTION__QUEUES__POSTGRES__ACK_WAIT"] = "30"  # the default: no lease expires
    try:
        d.start_io()
        leaving = d.runner()
        # Alone, it takes the first turn: its signal handlers are set once it has run one (with
        # two runners up, one fetcher can win every race for a while, so waiting for the first
        # to be picked could take any number of turns).
        assert result(d.post("warm", "0"))["pid"] == leaving.pid
        d.runner()
        sessions = [f"s{i}" for i in range(6)]
        ids = {
            (s, i): d.post(s, str(i), asynchronous=True, seconds=0.3).json()["request_id"]
            for i in range(4)
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
            assert_in_order_and_exclusive([turns[(s, i)] for i in range(4)])
        ran = [rid for rid in d.runs()[0::2] if rid in set(ids.values())]
        assert sorted(ran) == sorted(ids.values())  # each turn ran once
        # A drained runner hands nothing back: every turn was delivered exactly once.
        assert all(int(turn["attempt"]) == 1 for turn in turns.values())  # type: ignore[call-overload]
    finally:
        d.close()
