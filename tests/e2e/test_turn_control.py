"""Turn control across processes: a turn accepted by one IO process is cancelled through
another, and the multitask strategies hold, with runners in their own processes, on NATS
JetStream (Redis stores) and on SQS (moto, DynamoDB stores)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests import servers
from tests.e2e.deployment import Deployment
from tests.e2e.test_ecs import REST_SERVICE, EcsDeployment
from tests.e2e.test_nats import make as make_nats
from tests.stores.test_session_stores import create_session_table

pytestmark = [pytest.mark.slow]


class Split:
    """A deployment with two IO processes (``other`` is the second one's client)."""

    def __init__(self, deployment: Deployment, other: httpx.Client) -> None:
        self.d, self.other = deployment, other

    def post(self, session: str, prompt: str, **extra: object) -> str:
        response = self.d.post(session, prompt, asynchronous=True, **extra)
        assert response.status_code == 202, response.text
        return str(response.json()["request_id"])

    def wait_running(self, request_id: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while request_id not in self.d.runs():
            assert time.monotonic() < deadline, f"turn {request_id} did not start"
            time.sleep(0.05)

    def final(self, session: str, request_id: str) -> httpx.Response:
        return self.d.poll(session, request_id, timeout=40)


def second_io(deployment: Deployment, spawn: Callable[[int], object]) -> httpx.Client:
    port = servers.free_port()
    spawn(port)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    deadline = time.monotonic() + 30
    while True:
        try:
            if client.get("/health").status_code == 200:
                return client
        except httpx.HTTPError:
            assert time.monotonic() < deadline, "the second IO process did not start"
            time.sleep(0.1)


@pytest.fixture
def nats_split(nats_url: str, redis_url: str) -> Iterator[Split]:
    deployment = make_nats(nats_url, redis_url)
    deployment.start_io()
    other = second_io(deployment, lambda port: deployment.spawn("io", "--port", str(port)))
    deployment.runner()
    yield Split(deployment, other)
    other.close()
    deployment.close()


@pytest.fixture
def sqs_split(aws: str) -> Iterator[Split]:
    table = f"sessions-{uuid.uuid4().hex[:8]}"
    create_session_table(table)
    sessions = {"AK_SESSION__TYPE": "dynamodb", "AK_SESSION__DYNAMODB__TABLE_NAME": table}
    deployment = EcsDeployment(aws, extra_env=sessions)
    io_env = {
        "AK_EXECUTION__QUEUES__INPUT__URL": deployment.input,
        "AK_EXECUTION__QUEUES__OUTPUT__URL": deployment.output,
        "AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME": deployment.table,
    }

    def spawn(port: int) -> object:
        return deployment.spawn_script(REST_SERVICE, io_env | {"AK_API__PORT": str(port)})

    other = second_io(deployment, spawn)
    deployment.runner()
    yield Split(deployment, other)
    other.close()
    deployment.close()


@pytest.fixture(params=["nats", "sqs"])
def split(request: pytest.FixtureRequest) -> Split:
    if request.param == "nats":
        pytest.importorskip("nats")
        request.applymarker(pytest.mark.nats)
        return request.getfixturevalue("nats_split")  # type: ignore[no-any-return]
    request.applymarker(pytest.mark.aws)
    return request.getfixturevalue("sqs_split")  # type: ignore[no-any-return]


def sid() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


def test_a_turn_is_cancelled_through_another_io_process_within_a_second(split: Split) -> None:
    s = sid()
    rid = split.post(s, "long", seconds=30)
    split.wait_running(rid)
    began = time.monotonic()
    answer = split.other.post(f"/api/v1/chat/{s}/cancel", params={"request_id": rid})
    took = time.monotonic() - began
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "CANCELLED"
    assert took < 1.0, f"the cancel took {took:.2f}s"
    final = split.final(s, rid)
    assert final.status_code == 409 and final.json()["error"] == "CANCELLED"
    again = split.d.client.post(f"/api/v1/chat/{s}/cancel", params={"request_id": rid})
    assert again.status_code == 200  # idempotent, through the first IO process too


def test_a_queued_turn_cancelled_never_runs(split: Split) -> None:
    s = sid()
    ahead = split.post(s, "ahead", seconds=1.0)
    split.wait_running(ahead)
    queued = split.post(s, "queued", seconds=0)
    answer = split.other.post(f"/api/v1/chat/{s}/cancel", params={"request_id": queued})
    assert answer.status_code in (200, 202), answer.text
    assert split.final(s, ahead).status_code == 200
    assert split.final(s, queued).json()["error"] == "CANCELLED"
    assert queued not in split.d.runs()


def test_reject_interrupt_and_coalesce_across_processes(split: Split) -> None:
    s = sid()
    first = split.post(s, "a", seconds=30)
    split.wait_running(first)
    body = {"session_id": s, "prompt": "b", "agent": "timed", "multitask_strategy": "reject"}
    busy = split.other.post("/api/v1/chat", json=body)
    assert busy.status_code == 409 and busy.json()["error"] == "SESSION_BUSY"
    second = split.post(s, "c", seconds=1.0, multitask_strategy="interrupt")
    interrupted = split.final(s, first)
    assert interrupted.status_code == 409, interrupted.text
    assert interrupted.json()["reason"] == "interrupt"
    assert interrupted.json()["cancelled_by"] == second
    split.wait_running(second)
    queued = split.post(s, "d", seconds=0)
    newest = split.post(s, "e", seconds=0, multitask_strategy="coalesce")
    assert split.final(s, second).status_code == 200  # it had started: it finishes
    superseded = split.final(s, queued)
    assert superseded.json()["error"] == "SUPERSEDED"
    assert superseded.json()["superseded_by"] == newest
    assert split.final(s, newest).status_code == 200
    assert queued not in split.d.runs()
    rolled = split.post(s, "f", seconds=30)
    split.wait_running(rolled)
    last = split.post(s, "g", seconds=0, multitask_strategy="rollback")
    assert split.final(s, rolled).json()["reason"] == "rollback"
    assert split.final(s, last).status_code == 200
