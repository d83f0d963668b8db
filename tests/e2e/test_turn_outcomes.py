"""Turn outcomes across real processes and brokers: a poison turn that kills its runner fails
alone, and a runner killed between its commit and its acknowledgement does not run a turn twice.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import servers
from tests.e2e.deployment import Deployment
from tests.e2e.test_nats import nats_env
from tests.transports.test_sqs import create_fifo

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(300)]

AGENTS = Path(__file__).with_name("outcome_runner.py")
NORMAL_TURNS = 50


class Supervised(Deployment):
    """A deployment whose runner is restarted whenever it dies, like an orchestrator would."""

    def __init__(self, env: dict[str, str], redis_url: str) -> None:
        super().__init__(env)
        self.env |= {
            "AK_SESSION__TYPE": "redis",
            "AK_SESSION__REDIS__URL": redis_url,
            "AK_SESSION__REDIS__PREFIX": f"e2e:{self.tag}:",
            "AK_EXECUTION__RESPONSE_STORE__TYPE": "redis",
            "AK_EXECUTION__RESPONSE_STORE__REDIS__URL": redis_url,
            "AK_EXECUTION__RESPONSE_STORE__REDIS__PREFIX": f"e2e:{self.tag}:",
            "E2E_REDIS_URL": redis_url,
            "E2E_PREFIX": f"e2e:{self.tag}:",
        }
        self.restarts = 0
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._supervise, daemon=True)

    def start_runner(self) -> None:
        self._watch.start()

    def _supervise(self) -> None:
        runner = self.spawn("runner", str(AGENTS))
        while not self._stop.wait(0.2):
            if runner.poll() is not None and self.restarts < 10:
                self.restarts += 1
                runner = self.spawn("runner", str(AGENTS))

    def runs(self) -> list[str]:
        return self.run_log.read_text().split() if self.run_log.exists() else []

    def close(self) -> None:
        self._stop.set()
        if self._watch.is_alive():
            self._watch.join(5)
        super().close()

    def ask(self, session: str, prompt: str, **extra: object) -> str:
        body = {"session_id": session, "prompt": prompt, "agent": "remember", **extra}
        response = self.client.post("/api/v1/chat", json=body, headers={"Prefer": "respond-async"})
        assert response.status_code == 202, response.text
        return str(response.json()["request_id"])


def poison_beside_normal_turns(d: Supervised) -> None:
    d.start_io()
    d.start_runner()
    time.sleep(2)  # the runner is consuming before the burst arrives
    ids = {f"s{i}": d.ask(f"s{i}", f"p{i}", seconds=1.0) for i in range(NORMAL_TURNS // 2)}
    poison = d.ask("poison", "POISON")
    ids |= {
        f"s{i}": d.ask(f"s{i}", f"p{i}", seconds=1.0)
        for i in range(NORMAL_TURNS // 2, NORMAL_TURNS)
    }
    answers = {s: d.poll(s, rid, timeout=120) for s, rid in ids.items()}
    failed = {s: a.text for s, a in answers.items() if a.status_code != 200}
    assert not failed, f"innocent turns failed beside the poison turn: {failed}"
    for session, answer in answers.items():
        assert json.loads(answer.json()["result"]) == [f"p{session[1:]}"]
    verdict = d.poll("poison", poison, timeout=60)
    assert (verdict.status_code, verdict.json()["error"]) == (500, "TURN_FAILED")
    poison_runs = [r for r in d.runs() if r.startswith(f"{poison}:")]
    # Up to three runs, or four when one of its deliveries went to a crash or a hand-back beside it
    # and it got its late run alone; each of its runs killed the runner once.
    assert 2 <= len(poison_runs) <= 4, poison_runs
    assert d.restarts == len(poison_runs)


def commit_then_kill(d: Supervised) -> None:
    d.env["AK_SESSION__TYPE"] = "tests.e2e.die_after_commit.DieAfterCommit"
    d.start_io()
    d.start_runner()
    rid = d.ask("k", "die", seconds=0.1)
    answer = d.poll("k", rid, timeout=60)
    assert answer.status_code == 200, answer.text
    assert json.loads(answer.json()["result"]) == ["die"]
    assert [r.split(":")[:2] for r in d.runs()] == [[rid, "1"]], "the committed turn ran again"
    assert d.restarts == 1
    second = d.poll("k", d.ask("k", "next", seconds=0.1), timeout=30)
    assert json.loads(second.json()["result"]) == ["die", "next"]


# -- NATS -----------------------------------------------------------------------------------------


@pytest.fixture
def on_nats(nats_url: str, redis_url: str) -> Iterator[Supervised]:
    d = Supervised({}, redis_url)
    d.env |= nats_env(nats_url, redis_url, d.tag)
    d.env["AK_EXECUTION__RESPONSE_STORE__REDIS__PREFIX"] = f"e2e:{d.tag}:"
    yield d
    d.close()


@pytest.mark.nats
def test_a_poison_turn_fails_alone_on_nats(on_nats: Supervised) -> None:
    poison_beside_normal_turns(on_nats)


@pytest.mark.nats
def test_a_kill_between_commit_and_ack_does_not_rerun_the_turn_on_nats(
    on_nats: Supervised,
) -> None:
    commit_then_kill(on_nats)


# -- SQS ------------------------------------------------------------------------------------------


@pytest.fixture
def on_sqs(aws: str, redis_url: str) -> Iterator[Supervised]:
    tag = uuid.uuid4().hex[:10]
    d = Supervised(
        {
            **servers.aws_env(aws),
            "AK_EXECUTION__QUEUES__TYPE": "sqs",
            "AK_EXECUTION__QUEUES__INPUT__URL": create_fifo(f"in-{tag}", visibility=3),
            "AK_EXECUTION__QUEUES__OUTPUT__URL": create_fifo(f"out-{tag}", visibility=3),
            "AK_EXECUTION__QUEUES__SQS__WAIT_TIME_SECONDS": "1",
            "AK_EXECUTION__QUEUES__SQS__VISIBILITY_TIMEOUT": "3",
            "AK_EXECUTION__QUEUES__BATCH_SIZE": "10",
        },
        redis_url,
    )
    yield d
    d.close()


@pytest.mark.aws
def test_a_poison_turn_fails_alone_on_sqs(on_sqs: Supervised) -> None:
    poison_beside_normal_turns(on_sqs)


@pytest.mark.aws
def test_a_kill_between_commit_and_ack_does_not_rerun_the_turn_on_sqs(on_sqs: Supervised) -> None:
    commit_then_kill(on_sqs)
