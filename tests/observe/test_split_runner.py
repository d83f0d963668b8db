"""Split mode through the ``agentkernel`` command on NATS: the runner's port shows its turns
(what docs/walkthrough-split.md tells to ``curl``), and the IO's /metrics has none."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from tests import servers
from tests.e2e.deployment import Deployment
from tests.e2e.test_nats import make

pytestmark = [pytest.mark.nats, pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def split(nats_url: str, redis_url: str) -> Iterator[Deployment]:
    deployment = make(nats_url, redis_url)
    deployment.env["AK_SESSION__TYPE"] = "redis"
    deployment.env["AK_SESSION__REDIS__URL"] = redis_url
    deployment.env["AK_SESSION__REDIS__PREFIX"] = f"obs:{deployment.tag}:"
    deployment.start_io()
    yield deployment
    deployment.close()


def test_the_runner_command_serves_its_turns_on_its_health_port(split: Deployment) -> None:
    port = servers.free_port()
    runner = split.runner(env={"AK_EXECUTION__RUNNER__HEALTH_PORT": str(port)})
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert runner.poll() is None, runner.communicate()[1]
        try:
            if httpx.get(base + "/ready", timeout=10).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the runner's port never became ready"
        time.sleep(0.2)
    for prompt in ("one", "two", "three"):
        assert split.post("walk", prompt).status_code == 200
    runner_metrics = httpx.get(base + "/metrics", timeout=5).text
    assert 'agentkernel_turns_total{agent="timed",status="ok"} 3' in runner_metrics
    assert "agentkernel_turns_total{" not in split.client.get("/metrics").text
    runner.send_signal(signal.SIGINT)
    _, err = runner.communicate(timeout=60)
    assert runner.returncode == 0, err
    assert (
        sum("agentkernel.turns" in line and " succeeded in " in line for line in err.splitlines())
        == 3
    )
    assert " ERROR " not in err
