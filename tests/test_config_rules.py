"""Rules across configuration blocks: a reply must outlive the broker's dedup window."""

from __future__ import annotations

import pytest

from agentkernel.core.config.root import AKConfig, AKConfigError

#: transport env, the key the error names, the window in seconds
TRANSPORTS = [
    ({}, "execution.queues.in_memory.dedup_window", 300),
    (
        {
            "AK_EXECUTION__QUEUES__TYPE": "in_memory",
            "AK_EXECUTION__QUEUES__IN_MEMORY__DEDUP_WINDOW": "90",
        },
        "execution.queues.in_memory.dedup_window",
        90,
    ),
    ({"AK_EXECUTION__QUEUES__TYPE": "sqs"}, "SQS FIFO deduplication window", 300),
    (
        {
            "AK_EXECUTION__QUEUES__TYPE": "nats",
            "AK_EXECUTION__QUEUES__NATS__DUPLICATE_WINDOW": "600",
        },
        "execution.queues.nats.duplicate_window",
        600,
    ),
    (
        {"AK_EXECUTION__QUEUES__TYPE": "kafka", "AK_EXECUTION__QUEUES__KAFKA__DEDUP_WINDOW": "120"},
        "execution.queues.kafka.dedup_window",
        120,
    ),
]


def load(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], ttl: float) -> AKConfig:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if "NATS" in str(env):
        monkeypatch.setenv("AK_EXECUTION__QUEUES__NATS__URL", "nats://127.0.0.1:4222")
    if "KAFKA" in str(env):
        monkeypatch.setenv("AK_EXECUTION__QUEUES__KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    monkeypatch.setenv("AK_EXECUTION__RESPONSE_STORE__TTL", str(ttl))
    return AKConfig.load()


@pytest.mark.parametrize(("env", "key", "window"), TRANSPORTS)
def test_a_reply_ttl_shorter_than_the_dedup_window_is_refused(
    env: dict[str, str], key: str, window: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23: a TTL under the window left an idempotent retry unanswerable (never run)."""
    with pytest.raises(AKConfigError) as refused:
        load(monkeypatch, env, window - 1)
    message = str(refused.value)
    assert "execution.response_store.ttl" in message and key in message
    assert f"at least {window:g}" in message and "\n" not in message


@pytest.mark.parametrize(("env", "key", "window"), TRANSPORTS)
def test_a_reply_ttl_of_at_least_the_window_is_accepted(
    env: dict[str, str], key: str, window: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load(monkeypatch, env, window).execution.response_store.ttl == window


def test_a_transport_of_the_users_is_not_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"AK_EXECUTION__QUEUES__TYPE": "my_pkg.MyTransport"}
    assert load(monkeypatch, env, 1).execution.response_store.ttl == 1
