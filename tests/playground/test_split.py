"""The playground on the IO process of a split deployment (NATS, Redis replies): the page is
switched on by ``api.playground``, the IO process knows no agents, a runner process runs them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.deployment import Deployment
from tests.e2e.test_nats import nats_env

from .test_browser import WORDS, send

pytestmark = [pytest.mark.nats, pytest.mark.redis, pytest.mark.slow]

AGENTS = Path(__file__).with_name("agents.py")


@pytest.fixture
def split(nats_url: str, redis_url: str) -> Iterator[Deployment]:
    deployment = Deployment({})
    deployment.env |= nats_env(nats_url, redis_url, deployment.tag)
    deployment.env["AK_API__PLAYGROUND"] = "true"
    deployment.start_io()
    deployment.runner(AGENTS)
    yield deployment
    deployment.close()


def test_the_io_process_serves_the_page_and_streams_a_runners_turn(
    split: Deployment, page: Any
) -> None:
    page.goto(split.url + "/")
    expect(page.locator("#server")).to_have_text("server: up")
    expect(page.locator("#agent-info")).to_contain_text("the runner's default agent")
    expect(page.locator("#session-id")).not_to_have_value("")

    reply = send(page, WORDS, "stream", agent="spell")
    assert reply.get_attribute("data-outcome") == "200 ok"
    assert reply.locator(".text").text_content() == WORDS + " "
    first, end = int(reply.get_attribute("data-first-at")), int(reply.get_attribute("data-end-at"))
    assert end - first >= 600, (first, end)

    default = send(page, "hello", "sync", agent="")  # the runner's first agent: echo
    assert default.locator(".text").text_content() == "hello #1"
    expect(page.locator('#pipeline dd[data-metric="turns in flight"]')).to_have_text("0")
