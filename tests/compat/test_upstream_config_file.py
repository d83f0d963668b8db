"""A ``config.yaml`` written for upstream agentkernel 0.9.5, with a key of every section it
knows, loads here: its queue-mode keys are read, the rest are dropped with a warning each."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agentkernel.core.config import AKConfig
from agentkernel.core.upstream import UPSTREAM_ONLY

UPSTREAM_FILE = Path(__file__).with_name("upstream_config.yaml")


def test_every_section_of_an_upstream_file_loads(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="agentkernel.core.upstream"):
        config = AKConfig.load(UPSTREAM_FILE)
    execution = config.execution
    assert (execution.mode, execution.queues.type) == ("rest_async", "nats")
    assert execution.queues.nats is not None and execution.queues.nats.partitions == 4
    store = execution.response_store
    assert (store.type, store.ttl) == ("redis", 600.0)  # valkey read as redis, ttl moved up
    assert store.redis is not None and store.redis.prefix == "ak:responses:"
    assert store.redis.url == "redis://127.0.0.1:6379/0"
    assert (config.session.type, config.session.ttl) == ("redis", 100.0)
    assert config.api.host == "0.0.0.0"
    text = caplog.text
    for section in ("livekit", "whatsapp", "teams", "agui", "secret", "session.cosmosdb"):
        assert f"config key {section} is ignored" in text
    assert ("livekit",) in UPSTREAM_ONLY
