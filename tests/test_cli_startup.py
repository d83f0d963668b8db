"""Start-up failures against real servers: one ``agentkernel:`` line on stderr and exit 2, in
seconds, for a broker that cannot be reached and a queue or table that does not exist."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import boto3
import pytest

from tests import servers
from tests.cli_helpers import ECHO_AGENT, clean_env, one_line_error, run
from tests.servers import free_port


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    (tmp_path / "agents.py").write_text(ECHO_AGENT)
    return tmp_path


def closed_port() -> int:
    port = free_port()
    assert not servers.port_open(port)
    return port


def timed(*args: str, cwd: Path, env: dict[str, str]):  # type: ignore[no-untyped-def]
    began = time.monotonic()
    done = run(*args, cwd=cwd, env=env)
    return done, time.monotonic() - began


@pytest.fixture
def start_up(agents: Path) -> float:
    """Seconds a ``serve`` takes to start and refuse at once (a configuration error) on this
    machine right now: what a broker's wait is measured beyond. On a loaded CI machine a start
    alone took over 5 s, which a fixed bound read as a slow broker check."""
    env = clean_env(AK_EXECUTION__QUEUES__TYPE="carrier-pigeon")
    done, seconds = timed("serve", "agents.py", "--port", "0", cwd=agents, env=env)
    assert done.returncode == 2, done.stderr
    return seconds


def test_nats_unreachable_is_one_line_within_seconds(agents: Path, start_up: float) -> None:
    pytest.importorskip("nats")
    url = f"nats://127.0.0.1:{closed_port()}"
    env = clean_env(AK_EXECUTION__QUEUES__TYPE="nats", AK_EXECUTION__QUEUES__NATS__URL=url)
    done, seconds = timed("serve", "agents.py", "--port", "0", cwd=agents, env=env)
    line = one_line_error(done, f"cannot reach the NATS server at {url} within 5s")
    assert "ConnectionRefusedError" in line
    assert seconds - start_up < 9  # the 5 s budget; before: a 45-line traceback after 15 s
    assert "agentkernel.cli" not in done.stderr  # no start-up summary for what did not start


def test_kafka_unreachable_is_one_line_within_seconds(agents: Path, start_up: float) -> None:
    pytest.importorskip("confluent_kafka")
    bootstrap = f"127.0.0.1:{closed_port()}"
    env = clean_env(
        AK_EXECUTION__QUEUES__TYPE="kafka",
        AK_EXECUTION__QUEUES__KAFKA__BOOTSTRAP_SERVERS=bootstrap,
        AK_EXECUTION__QUEUES__KAFKA__BOOKKEEPING="in_memory",
    )
    done, seconds = timed("serve", "agents.py", "--port", "0", cwd=agents, env=env)
    one_line_error(done, f"Kafka metadata from {bootstrap} failed")
    assert seconds - start_up < 9  # the 5 s metadata budget


def fifo(name: str) -> str:
    attributes = {"FifoQueue": "true", "ContentBasedDeduplication": "false"}
    return str(boto3.client("sqs").create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])


def table(name: str, key: str) -> str:
    boto3.client("dynamodb").create_table(
        TableName=name,
        KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name


def sqs_env(aws: str, input_url: str, output_url: str, **extra: str) -> dict[str, str]:
    return clean_env(
        **servers.aws_env(aws),
        AK_EXECUTION__QUEUES__TYPE="sqs",
        AK_EXECUTION__QUEUES__INPUT__URL=input_url,
        AK_EXECUTION__QUEUES__OUTPUT__URL=output_url,
        **extra,
    )


@pytest.mark.aws
def test_a_runner_with_a_missing_sqs_queue_says_so_once(aws: str, agents: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    missing = f"{aws}/123456789012/missing-{tag}.fifo"
    env = sqs_env(
        aws,
        missing,
        fifo(f"out-{tag}.fifo"),
        AK_SESSION__TYPE="dynamodb",
        AK_SESSION__DYNAMODB__TABLE_NAME=table(f"sessions-{tag}", "session_id"),
    )
    done = run("runner", "agents.py", cwd=agents, env=env)
    # before: one traceback per consumer thread (5), exit 1
    one_line_error(done, f"SQS queue {missing} does not exist")


@pytest.mark.aws
def test_an_io_with_a_missing_input_queue_does_not_start(aws: str, agents: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    missing = f"{aws}/123456789012/missing-{tag}.fifo"
    env = sqs_env(
        aws,
        missing,
        fifo(f"out-{tag}.fifo"),
        AK_EXECUTION__RESPONSE_STORE__TYPE="dynamodb",
        AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME=table(f"resp-{tag}", "request_id"),
        AK_API__PORT=str(free_port()),
    )
    done = run("io", cwd=agents, env=env)  # before: served, and answered 503 QUEUE_UNAVAILABLE
    one_line_error(done, f"SQS queue {missing} does not exist")


@pytest.mark.aws
def test_a_missing_dynamodb_table_stops_start_up(aws: str, agents: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    queues = (fifo(f"in-{tag}.fifo"), fifo(f"out-{tag}.fifo"))
    io_env = sqs_env(
        aws,
        *queues,
        AK_EXECUTION__RESPONSE_STORE__TYPE="dynamodb",
        AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME=f"missing-{tag}",
        AK_API__PORT=str(free_port()),
    )
    one_line_error(
        run("io", cwd=agents, env=io_env),
        f"execution.response_store.dynamodb.table_name: DynamoDB table 'missing-{tag}' does not "
        "exist",
    )
    runner_env = sqs_env(
        aws,
        *queues,
        AK_SESSION__TYPE="dynamodb",
        AK_SESSION__DYNAMODB__TABLE_NAME=f"missing-{tag}",
    )
    one_line_error(
        run("runner", "agents.py", cwd=agents, env=runner_env),
        f"session.dynamodb.table_name: DynamoDB table 'missing-{tag}' does not exist",
    )


@pytest.mark.redis
def test_an_unreachable_redis_store_is_one_line(agents: Path) -> None:
    pytest.importorskip("redis")
    env = clean_env(
        AK_EXECUTION__RESPONSE_STORE__TYPE="redis",
        AK_EXECUTION__RESPONSE_STORE__REDIS__URL=f"redis://127.0.0.1:{closed_port()}/0",
    )
    done = run("serve", "agents.py", "--port", "0", cwd=agents, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
