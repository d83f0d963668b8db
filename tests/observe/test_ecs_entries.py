"""The guide's ECS entry files, unchanged, log like the CLI and show the runner's turns.

Real processes on moto's SQS and DynamoDB, configured only by environment variables.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from tests import servers
from tests.e2e.test_ecs import EcsDeployment

pytestmark = [pytest.mark.aws, pytest.mark.slow]

TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
)


@pytest.fixture
def ecs(aws: str) -> Iterator[EcsDeployment]:
    deployment = EcsDeployment(aws)
    yield deployment
    deployment.close()


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def wait_for(url: str, timeout: float = 20) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return httpx.get(url, timeout=5)
        except httpx.HTTPError:
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.1)


def test_entry_files_log_at_info_with_time_and_level(ecs: EcsDeployment) -> None:
    health_port = servers.free_port()
    ecs.env["AK_EXECUTION__RUNNER__HEALTH_PORT"] = str(health_port)
    runner = ecs.runner()
    wait_for(f"http://127.0.0.1:{health_port}/health")
    reply = ecs.post("s1", "hello")
    assert reply.status_code == 200, reply.text
    request_id = reply.json()["request_id"]
    assert ecs.io is not None
    io_lines, runner_lines = stop(ecs.io).splitlines(), stop(runner).splitlines()
    for lines in (io_lines, runner_lines):
        assert lines and all(TEXT_LINE.match(line) for line in lines), lines
    assert any(" INFO " in line and "draining" in line for line in io_lines)
    (turn,) = [line for line in runner_lines if "agentkernel.turns" in line]
    assert f"turn {request_id} of session s1 (agent timed, attempt 1) succeeded in " in turn


def test_the_runner_port_shows_its_turns_health_and_readiness(ecs: EcsDeployment) -> None:
    health_port = servers.free_port()
    ecs.env["AK_EXECUTION__RUNNER__HEALTH_PORT"] = str(health_port)
    ecs.env["AK_LOGGING__FORMAT"] = "json"
    runner = ecs.runner()
    base = f"http://127.0.0.1:{health_port}"
    assert wait_for(base + "/health").json() == {"status": "ok"}
    assert ecs.post("s2", "one").status_code == 200
    assert ecs.post("s2", "two").status_code == 200
    ready = httpx.get(base + "/ready", timeout=10)
    assert ready.status_code == 200 and ready.json()["broker"] == "ok", ready.text
    metrics = httpx.get(base + "/metrics", timeout=5).text
    assert 'agentkernel_turns_total{agent="timed",status="ok"} 2' in metrics
    assert 'agentkernel_turn_duration_seconds_count{agent="timed"} 2' in metrics
    err = stop(runner)
    assert all(line.startswith("{") for line in err.splitlines()), err


def test_a_clean_ctrl_c_of_the_io_in_its_long_polls_logs_no_error(aws: str) -> None:
    deployment = EcsDeployment(aws, long_poll=20)  # the product default
    try:
        time.sleep(1.0)  # the OUTPUT consumers are in their long polls
        assert deployment.io is not None
        deployment.io.send_signal(signal.SIGINT)
        _, err = deployment.io.communicate(timeout=60)
        assert deployment.io.returncode == 0, err
        assert " ERROR " not in err and "Traceback" not in err, err
        assert "drain finished; exiting with status 0" in err
    finally:
        deployment.close()


def _entry(script: object, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )


def test_entry_files_refuse_a_missing_queue_or_table_in_one_line(aws: str) -> None:
    import os

    import boto3

    from tests.e2e.test_ecs import REST_SERVICE, TEST_RUNNER
    from tests.transports.test_sqs import create_fifo

    base = {**os.environ, **servers.aws_env(aws)}
    base.pop("AK_CONFIG_PATH_OVERRIDE", None)
    output = create_fifo(f"out-{time.monotonic_ns()}", visibility=3)
    missing = output.replace("/out-", "/never-created-")
    runner = _entry(
        TEST_RUNNER,
        base
        | {
            "AK_EXECUTION__QUEUES__INPUT__URL": missing,
            "AK_EXECUTION__QUEUES__OUTPUT__URL": output,
        },
    )
    table = f"never-created-{time.monotonic_ns()}"
    boto3.client(
        "dynamodb", endpoint_url=aws
    ).list_tables()  # moto answers: only the table is missing
    io = _entry(
        REST_SERVICE,
        base
        | {
            "AK_EXECUTION__QUEUES__INPUT__URL": output,
            "AK_EXECUTION__QUEUES__OUTPUT__URL": output,
            "AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME": table,
            "AK_API__PORT": str(servers.free_port()),
        },
    )
    for done, name in ((runner, "never-created-"), (io, table)):
        errors = [line for line in done.stderr.splitlines() if line.startswith("agentkernel: ")]
        assert done.returncode == 2, done.stderr
        assert len(errors) == 1 and name in errors[0], done.stderr
        assert "Traceback" not in done.stderr
