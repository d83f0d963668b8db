"""The split walkthrough's local recipes, run as written: its agent and configuration on a
Tansu Kafka broker with Redis, and on moto's SQS and DynamoDB after examples/local/aws_resources.py
created the queues and tables."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agentkernel.client import ChatClient
from tests import servers
from tests.e2e.deployment import Deployment

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WALKTHROUGH = (ROOT / "docs" / "walkthrough-split.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", WALKTHROUGH, re.DOTALL)


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    [code] = [b for b in blocks("python") if "Module(" in b]
    path = tmp_path / "agents.py"
    path.write_text(code)
    return path


def two_turns(deployment: Deployment, agents: Path) -> list[str]:
    deployment.start_io()
    deployment.runner(agents)
    client = ChatClient(deployment.url, timeout=60)
    try:
        return [client.ask("demo", prompt, "remember") for prompt in ("hello", "again")]
    finally:
        client.close()


@pytest.fixture
def deployments() -> Iterator[list[Deployment]]:
    started: list[Deployment] = []
    yield started
    for deployment in started:
        deployment.close()


@pytest.mark.kafka
@pytest.mark.redis
def test_the_kafka_recipe_answers_turns(
    tansu_broker: servers.Tansu,
    redis_url: str,
    agents: Path,
    tmp_path: Path,
    deployments: list[Deployment],
) -> None:
    # The broker the recipe starts is the one the fixture starts (same binary, same flags).
    recipe = next(b for b in blocks("bash") if "tansu" in b.lower())
    assert "--advertised-listener-url" in recipe and "memory://tansu/" in recipe
    nats_config = yaml.safe_load(next(b for b in blocks("yaml") if "type: nats" in b))
    kafka_block = yaml.safe_load(next(b for b in blocks("yaml") if "type: kafka" in b))
    tansu = yaml.safe_load(
        re.search(r"<!-- snippet: tansu-consumer -->\n```yaml\n(.*?)```", WALKTHROUGH, re.DOTALL)
        .group(1)  # type: ignore[union-attr]
        .replace("      ", "", 1)
    )
    config = nats_config
    tag = uuid.uuid4().hex[:8]
    kafka = kafka_block["queues"]["kafka"] | tansu | {"group_id": f"walk-{tag}"}
    kafka |= {"bootstrap_servers": tansu_broker.bootstrap, "input_topic": f"in-{tag}"}
    kafka |= {"output_topic": f"out-{tag}", "bookkeeping_redis_url": redis_url}
    config["execution"]["queues"] = kafka_block["queues"] | {"kafka": kafka}
    for block in (config["execution"]["response_store"]["redis"], config["session"]["redis"]):
        block |= {"url": redis_url, "prefix": f"walk-{tag}:"}  # the session's Redis
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    deployment = Deployment({"AK_CONFIG_PATH_OVERRIDE": str(tmp_path / "config.yaml")})
    deployments.append(deployment)
    answers = two_turns(deployment, agents)
    assert answers[1] == "turn 2 of this session, served by a runner: hello, again"


@pytest.mark.aws
def test_the_moto_recipe_creates_what_the_processes_need(
    aws: str, agents: Path, deployments: list[Deployment]
) -> None:
    recipe = next(b for b in blocks("bash") if "aws_resources.py" in b)
    assert "AWS_ENDPOINT_URL" in recipe and "set -a" in recipe
    tag = f"walk-{uuid.uuid4().hex[:8]}"
    created = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "local" / "aws_resources.py"), tag],
        capture_output=True,
        text=True,
        check=True,
        env=servers.aws_env(aws) | {"PATH": "/usr/bin:/bin"},
    )
    env = dict(line.split("=", 1) for line in created.stdout.splitlines())
    assert env["AK_EXECUTION__QUEUES__INPUT__URL"].endswith(f"{tag}-input.fifo")
    again = subprocess.run(  # running it again is harmless
        [sys.executable, str(ROOT / "examples" / "local" / "aws_resources.py"), tag],
        capture_output=True,
        text=True,
        env=servers.aws_env(aws) | {"PATH": "/usr/bin:/bin"},
    )
    assert again.returncode == 0 and again.stdout == created.stdout, again.stderr
    deployment = Deployment(
        servers.aws_env(aws) | env | {"AK_EXECUTION__QUEUES__SQS__WAIT_TIME_SECONDS": "1"}
    )
    deployments.append(deployment)
    answers = two_turns(deployment, agents)
    assert answers[1] == "turn 2 of this session, served by a runner: hello, again"
