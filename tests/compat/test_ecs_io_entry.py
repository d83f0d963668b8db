"""``ECSIOHandler.run(auth_validator=, handlers=)`` in a real container-like process on moto's
SQS and DynamoDB: it listens on every interface unless ``api.host`` says otherwise, while the
laptop server keeps to loopback."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from agentkernel.aws.settings import CONTAINER_HOST, container_api
from agentkernel.core.config import AKConfig
from tests import servers
from tests.e2e.deployment import Deployment
from tests.transports.test_sqs import create_fifo

ENTRY = Path(__file__).with_name("ecs_io_entry.py")


def listening_addresses(port: int) -> set[str]:
    """Local addresses of the IPv4 sockets listening on ``port`` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.add(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


class IOContainer(Deployment):
    def __init__(self, moto_url: str, **env: str) -> None:
        super().__init__(servers.aws_env(moto_url))
        table = f"responses-{self.tag}"
        boto3.client("dynamodb").create_table(
            TableName=table,
            KeySchema=[{"AttributeName": "request_id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "request_id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        variables = {
            "AK_EXECUTION__QUEUES__INPUT__URL": create_fifo(f"in-{self.tag}"),
            "AK_EXECUTION__QUEUES__OUTPUT__URL": create_fifo(f"out-{self.tag}"),
            "AK_EXECUTION__QUEUES__SQS__WAIT_TIME_SECONDS": "1",
            "AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME": table,
            "AK_API__PORT": str(self.port),
            **env,
        }
        self.io = subprocess.Popen(
            [sys.executable, str(ENTRY)],
            env={**self.env, **variables},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(self.io)
        self.wait_healthy()


@pytest.mark.aws
def test_the_io_container_serves_the_validator_and_handlers_on_every_interface(aws: str) -> None:
    container = IOContainer(aws)
    try:
        assert listening_addresses(container.port) == {"0.0.0.0"}
        client, good = container.client, {"Authorization": "Bearer good-token"}
        assert client.get("/app/status").status_code == 401
        assert client.get("/app/status", headers=good).json() == {"status": "custom"}
        assert (
            client.get("/api/v1/agents", headers={"Authorization": "Bearer x"}).status_code == 401
        )
        turn = {"session_id": "c1", "prompt": "hello"}
        queued = client.post("/api/v1/chat", json=turn, headers=good | {"Prefer": "respond-async"})
        assert queued.status_code == 202, queued.text  # on the SQS INPUT queue
        assert container.io is not None
        container.io.send_signal(signal.SIGTERM)
        assert container.io.wait(timeout=30) == 0
    finally:
        container.close()


@pytest.mark.aws
def test_an_explicit_api_host_is_kept_in_the_container(aws: str) -> None:
    container = IOContainer(aws, AK_API__HOST="127.0.0.1")
    try:
        assert listening_addresses(container.port) == {"127.0.0.1"}
    finally:
        container.close()


def test_the_container_default_applies_only_where_api_host_is_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert AKConfig.load().api.host == "127.0.0.1"  # agentkernel serve on a laptop
    assert container_api(AKConfig.load()).api.host == CONTAINER_HOST == "0.0.0.0"
    monkeypatch.setenv("AK_API__PORT", "9000")  # another api key set: host still unset
    assert container_api(AKConfig.load()).api.host == "0.0.0.0"
    monkeypatch.setenv("AK_API__HOST", "10.1.2.3")
    assert container_api(AKConfig.load()).api.host == "10.1.2.3"
    explicit = AKConfig(api={"host": "127.0.0.1"})
    assert container_api(explicit).api.host == "127.0.0.1"
