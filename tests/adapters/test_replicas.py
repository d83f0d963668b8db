"""A conversation continues on another runner process: IO process and runner processes on NATS
JetStream, replies and session state in Redis, the real SDKs talking to the fake model server."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentkernel.testing.fake_openai import FakeOpenAI
from tests.e2e.deployment import Deployment
from tests.e2e.test_nats import nats_env

from .conftest import answer, ask, new_session, stream

pytestmark = [pytest.mark.nats, pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("runner_app.py")


@pytest.fixture
def deployment(nats_url: str, redis_url: str, model: FakeOpenAI) -> Iterator[Deployment]:
    d = Deployment({})
    d.env |= nats_env(nats_url, redis_url, d.tag) | model.env()
    d.env |= {
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),  # this checkout first
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
        "AK_SESSION__TYPE": "redis",
        "AK_SESSION__REDIS__URL": redis_url,
        "AK_SESSION__REDIS__PREFIX": f"e2e:{d.tag}:session:",
    }
    d.start_io()
    yield d
    d.close()


def stop(runner: subprocess.Popen[str]) -> None:
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(30) == 0, runner.communicate()[1]


def test_the_next_turn_on_another_runner_remembers_the_first(deployment: Deployment) -> None:
    d, chat, graph = deployment, new_session(), new_session()
    first = d.spawn("runner", str(RUNNER))
    assert answer(ask(d.client, chat, "triage", "hello", asynchronous=True)).startswith(
        "[Triage] You said: hello."
    )
    assert answer(ask(d.client, graph, "helper", "hi there")).startswith("[Helper] You said: hi")
    stop(first)

    d.spawn("runner", str(RUNNER))
    frames = stream(d.client, chat, "triage", "transfer_to_billing and add 4 5")
    result = frames[-1]["result"]
    assert "".join(f["delta"] for f in frames[:-1]) == result
    assert result.startswith("[Billing agent] You said: transfer_to_billing and add 4 5.")
    assert "Before that you said: hello." in result and "add returned 9." in result
    second = answer(ask(d.client, graph, "helper", "lookup Oslo", asynchronous=True))
    assert second == (
        "[Helper] You said: lookup Oslo. Before that you said: hi there. "
        "(2 messages from you so far.) lookup returned sunny in Oslo."
    )
