"""The containerized queue mode end to end: the guide's two entry files as real processes on
moto's SQS and DynamoDB, configured only by the guide's environment variables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from agentkernel.testing.fake_openai import FakeOpenAI
from tests import servers
from tests.e2e.deployment import Deployment, assert_in_order_and_exclusive, result
from tests.transports.test_sqs import create_fifo

pytestmark = [pytest.mark.aws, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
REST_SERVICE = ROOT / "examples" / "ecs" / "app_rest_service.py"
EXAMPLE_RUNNER = ROOT / "examples" / "ecs" / "app_agent_runner.py"
TEST_RUNNER = Path(__file__).with_name("ecs_test_runner.py")
APP_MAX_RECEIVE = 2


class EcsDeployment(Deployment):
    """Queues (input with a redrive policy to a DLQ), a table, the guide's two entry files."""

    def __init__(
        self, moto_url: str, long_poll: int = 1, extra_env: dict[str, str] | None = None
    ) -> None:
        super().__init__(
            {
                **servers.aws_env(moto_url),
                "AK_EXECUTION__QUEUES__SQS__WAIT_TIME_SECONDS": str(long_poll),
                # the lease every receive asks for (the product default is 30 s)
                "AK_EXECUTION__QUEUES__SQS__VISIBILITY_TIMEOUT": "3",
                **(extra_env or {}),
            }
        )
        tag = self.tag
        self.dlq = create_fifo(f"dlq-{tag}", visibility=3)
        self.input = create_fifo(
            f"in-{tag}", visibility=3, redrive_to=self.dlq, max_receive=APP_MAX_RECEIVE + 1
        )
        self.output = create_fifo(f"out-{tag}", visibility=3)
        self.table = f"responses-{tag}"
        boto3.client("dynamodb").create_table(
            TableName=self.table,
            KeySchema=[{"AttributeName": "request_id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "request_id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        self.io = self.spawn_script(
            REST_SERVICE,
            {
                "AK_EXECUTION__QUEUES__INPUT__URL": self.input,
                "AK_EXECUTION__QUEUES__OUTPUT__URL": self.output,
                "AK_EXECUTION__QUEUES__OUTPUT__NO_OF_CONSUMERS": "2",
                "AK_EXECUTION__QUEUES__BATCH_SIZE": "10",
                "AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME": self.table,
                "AK_API__PORT": str(self.port),
            },
        )
        self.wait_healthy()

    def spawn_script(self, script: Path, env: dict[str, str]) -> subprocess.Popen[str]:
        """Run an entry file as is, configured only by environment variables."""
        proc = subprocess.Popen(
            [sys.executable, str(script)],
            env={**self.env, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def runner(  # type: ignore[override]
        self, script: Path = TEST_RUNNER, consumers: int = 3, batch: int = 10, long_poll: int = 1
    ) -> subprocess.Popen[str]:
        return self.spawn_script(
            script,
            {
                "AK_EXECUTION__QUEUES__SQS__WAIT_TIME_SECONDS": str(long_poll),
                "AK_EXECUTION__QUEUES__INPUT__URL": self.input,
                "AK_EXECUTION__QUEUES__OUTPUT__URL": self.output,
                "AK_EXECUTION__QUEUES__INPUT__MAX_RECEIVE_COUNT": str(APP_MAX_RECEIVE),
                "AK_EXECUTION__QUEUES__INPUT__NO_OF_CONSUMERS": str(consumers),
                "AK_EXECUTION__QUEUES__BATCH_SIZE": str(batch),
            },
        )


@pytest.fixture
def ecs(aws: str) -> Iterator[EcsDeployment]:
    deployment = EcsDeployment(aws)
    yield deployment
    deployment.close()


def test_rest_sync_and_async_with_polling(ecs: EcsDeployment) -> None:
    ecs.runner()
    assert result(ecs.post("s1", "hello"))["prompt"] == "hello"
    accepted = ecs.post("s1", "later", asynchronous=True, seconds=1.5)
    assert accepted.status_code == 202
    request_id = accepted.json()["request_id"]
    early = ecs.client.get("/api/v1/chat/s1", params={"request_id": request_id})
    assert early.status_code == 404
    assert result(ecs.poll("s1", request_id))["prompt"] == "later"
    wrong = ecs.client.get("/api/v1/chat/other", params={"request_id": request_id})
    assert (wrong.status_code, wrong.json()["error"]) == (404, "NOT_FOUND")


def test_the_example_runner_file_runs_unchanged(ecs: EcsDeployment) -> None:
    with FakeOpenAI() as model:  # the example's OpenAI agent, offline
        ecs.env |= model.env() | {
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        }
        ecs.runner(EXAMPLE_RUNNER)
        first = ecs.client.post("/api/v1/chat", json={"session_id": "ex", "prompt": "hi"})
        assert first.status_code == 200, first.text
        assert first.json()["result"] == "[Assistant] You said: hi. (1 messages from you so far.)"
        body = {"session_id": "ex", "prompt": "word_count of these four words"}
        second = ecs.client.post("/api/v1/chat", json=body)
        assert second.status_code == 200, second.text
        assert "Before that you said: hi." in second.json()["result"]
        assert "word_count returned 4." in second.json()["result"]


def test_order_per_session_across_two_runner_processes(ecs: EcsDeployment) -> None:
    # Short polls, so the burst is spread over both runners' receives at once.
    ecs.runner(batch=1, consumers=2, long_poll=0)
    ecs.runner(batch=1, consumers=2, long_poll=0)
    time.sleep(2.5)  # both runners polling before the burst
    sessions, per_session = [f"s{n}" for n in range(6)], 5
    pending = {}
    for i in range(per_session):
        for session in sessions:
            response = ecs.post(session, str(i), asynchronous=True, seconds=0.3)
            pending[(session, i)] = response.json()["request_id"]
    runs = {key: result(ecs.poll(key[0], rid)) for key, rid in pending.items()}
    for session in sessions:
        assert_in_order_and_exclusive([runs[(session, i)] for i in range(per_session)])
    assert len({r["pid"] for r in runs.values()}) == 2, "both runner processes took turns"


def test_kill_9_mid_turn_is_redelivered_and_answered_once(ecs: EcsDeployment) -> None:
    victim = ecs.runner()
    request_id = ecs.post("k", "survive", asynchronous=True, seconds=2.0).json()["request_id"]
    ecs.wait_started(request_id)  # the turn is running in the victim
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    ecs.runner()
    answer = result(ecs.poll("k", request_id))
    assert answer["attempt"] == 2 and answer["prompt"] == "survive"
    sqs = boto3.client("sqs")
    assert sqs.receive_message(QueueUrl=ecs.dlq, WaitTimeSeconds=1).get("Messages") is None


def test_poison_turn_gets_an_error_reply_and_lands_in_the_dlq(ecs: EcsDeployment) -> None:
    ecs.runner()
    response = ecs.client.post(
        "/api/v1/chat", json={"session_id": "p", "prompt": "x", "agent": "poison"}
    )
    assert response.status_code == 500
    assert response.json()["error"] == "TURN_FAILED"
    sqs = boto3.client("sqs")
    deadline = time.monotonic() + 20
    moved: list[dict[str, object]] = []
    while not moved and time.monotonic() < deadline:
        moved = sqs.receive_message(QueueUrl=ecs.dlq, WaitTimeSeconds=1).get("Messages", [])
    assert [json.loads(str(m["Body"]))["prompt"] for m in moved] == ["x"]


def test_sigterm_lets_the_in_flight_turn_finish(ecs: EcsDeployment) -> None:
    runner = ecs.runner()
    request_id = ecs.post("t", "finish-me", asynchronous=True, seconds=2.0).json()["request_id"]
    ecs.wait_started(request_id)  # in flight, in a runner that is up (its handlers installed)
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(30) == 0, runner.communicate()[1]
    answer = result(ecs.poll("t", request_id, timeout=10))
    assert answer["attempt"] == 1


def test_a_turn_longer_than_the_visibility_timeout_runs_once(ecs: EcsDeployment) -> None:
    ecs.runner()
    ecs.runner()
    time.sleep(2.0)
    response = ecs.post("long", "slow-turn", seconds=5.0)  # visibility timeout is 3 s
    assert result(response)["attempt"] == 1
    time.sleep(4.0)  # without lease extension a second execution has started by now
    runs = ecs.runs()
    assert runs == [response.json()["request_id"], "1"], f"the turn ran more than once: {runs}"
