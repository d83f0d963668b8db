"""config.yaml files written for the upstream queue mode load; typos are still errors."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentkernel.core.config.root import AKConfig, AKConfigError


def load(tmp_path: Path, text: str) -> AKConfig:
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text))
    return AKConfig.load(path)


UPSTREAM_ECS = """
    execution:
      mode: rest_sync
      queues:
        type: sqs
        input: {max_receive_count: 3, no_of_consumers: 5}
        output: {no_of_consumers: 2}
      response_store:
        type: dynamodb
        retry_count: 10
        delay: 0.5
        dynamodb: {table_name: replies}
    session:
      type: redis
      redis: {url: "redis://localhost:6379"}
      cache: {size: 256}
    logging:
      ak: {level: DEBUG}
    api:
      host: 0.0.0.0
      port: 8000
      custom_router_prefix: /custom
      max_file_size: 10485760
"""

UPSTREAM_STREAM = """
    execution:
      mode: stream
      queues: {type: nats, nats: {url: "nats://127.0.0.1:4222"}}
      response_store:
        type: redis
        redis: {url: "redis://localhost:6379"}
        retry_count: 5
        delay: 5
    websocket_api:
      chat_route: chat
      push_auth_token: secret
    session: {type: in_memory}
"""

UPSTREAM_ASYNC = """
    execution:
      mode: async
      realtime: {playback_lead_ms: 200}
    session:
      type: dynamodb
      dynamodb: {table_name: sessions}
      connection_store: {table_name: connections, ttl: 86400}
"""


def test_an_upstream_ecs_file_loads_and_upstream_only_keys_are_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agentkernel.core"):
        config = load(tmp_path, UPSTREAM_ECS)
    store = config.execution.response_store
    assert (store.type, store.retry_count, store.delay) == ("dynamodb", 10, 0.5)
    assert store.sync_wait(60.0, pushes=False) == 5.0  # 10 x 0.5 s bounds a polling store
    assert store.sync_wait(60.0, pushes=True) == 60.0
    assert (config.session.type, config.logging.ak.level) == ("redis", "DEBUG")
    ignored = " ".join(r.getMessage() for r in caplog.records)
    for key in ("session.cache", "api.custom_router_prefix", "api.max_file_size"):
        assert f"config key {key} is ignored" in ignored


def test_retry_count_with_a_pushing_store_is_deprecated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agentkernel.core"):
        config = load(tmp_path, UPSTREAM_STREAM)
    assert config.execution.mode == "stream"
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "retry_count/delay are deprecated" in messages
    assert "config key websocket_api is ignored" in messages


def test_the_serverless_async_file_loads(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="agentkernel.core"):
        config = load(tmp_path, UPSTREAM_ASYNC)
    assert (config.execution.mode, config.session.dynamodb.table_name) == ("async", "sessions")  # type: ignore[union-attr]
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "execution.realtime" in messages and "session.connection_store" in messages


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sesion: {type: redis}\n", r"sesion: unknown key; did you mean session\?"),
        (
            "execution: {queus: {type: sqs}}\n",
            r"execution\.queus: unknown key; did you mean execution\.queues\?",
        ),
        (
            "execution: {queues: {input: {max_recieve_count: 2}}}\n",
            r"did you mean execution\.queues\.input\.max_receive_count\?",
        ),
        ("logging: {ak: {level: LOUD}}\n", r"logging\.ak\.level"),
        ("zzz: 1\n", r"zzz: unknown key$"),
    ],
)
def test_typos_are_errors_naming_the_closest_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(AKConfigError, match=message):
        load(tmp_path, text)


def test_the_logging_level_applies_to_the_command(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("logging: {ak: {level: WARNING}}\n")
    code = (
        "import logging, sys\n"
        "from agentkernel.cli import commands as cli\n"
        "import argparse\n"
        "cli._configure(argparse.Namespace(config='config.yaml', host=None, port=None))\n"
        "print(logging.getLogger('agentkernel').level)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(logging.WARNING)


UPSTREAM_SCALABLE = """
    library_version: "0.2"
    trace: {enabled: true, type: langfuse}
    guardrail: {input: {enabled: false}}
    logging: {ak: {level: INFO}, system: {level: WARNING}}
    api: {port: 8000, enabled_routes: {agents: true}}
    execution:
      mode: rest_async
      queues: {type: sqs}
      response_store:
        type: dynamodb
        dynamodb: {table_name: responses, ttl: 7200}
    session:
      type: redis
      redis: {url: "redis://127.0.0.1:6379", ttl: 3600}
"""


def test_backend_ttls_move_up_and_upstream_feature_blocks_only_warn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agentkernel.core"):
        config = load(tmp_path, UPSTREAM_SCALABLE)
    assert (config.execution.response_store.ttl, config.session.ttl) == (7200, 3600)
    assert config.execution.response_store.dynamodb.table_name == "responses"  # type: ignore[union-attr]
    text = caplog.text
    assert "execution.response_store.dynamodb.ttl is read as execution.response_store.ttl" in text
    assert "session.redis.ttl is read as session.ttl" in text
    for key in ("library_version", "trace", "guardrail", "logging.system", "api.enabled_routes"):
        assert f"config key {key} is ignored" in text


def test_a_backend_ttl_never_overrides_the_key_set_here(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agentkernel.core"):
        config = load(
            tmp_path,
            "session: {type: in_memory, ttl: 60, redis: {url: 'redis://x', ttl: 5}}\n",
        )
    assert config.session.ttl == 60
    assert "session.redis.ttl is ignored: session.ttl is set" in caplog.text


def test_valkey_stores_are_read_as_redis(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="agentkernel.core"):
        config = load(
            tmp_path,
            """
            execution:
              response_store:
                type: valkey
                valkey: {url: "valkeys://cache:6380/0", prefix: "ak:responses:", ttl: 600}
            session:
              type: valkey
              valkey: {url: "valkey://cache:6379"}
            """,
        )
    store = config.execution.response_store
    assert (store.type, store.redis.url, store.ttl) == ("redis", "rediss://cache:6380/0", 600)  # type: ignore[union-attr]
    assert (config.session.type, config.session.redis.url) == ("redis", "redis://cache:6379")  # type: ignore[union-attr]
    assert "execution.response_store.type: valkey is read as redis" in caplog.text
