"""Upstream agentkernel's import paths and keyword arguments, used as upstream users write them.

Each name must be this package's own object (an alias, never a copy), and importing the old
paths must not import anything heavy or optional.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import typing

import pytest

from agentkernel.core.config import AKConfig, ExecutionConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.pipeline.envelope import QueueName
from agentkernel.pipeline.process.thread_runner import ThreadRunner
from agentkernel.pipeline.transport.in_memory import InMemoryTransport

# -- import paths ----------------------------------------------------------------------------


def test_the_thread_runner_keeps_its_deployment_common_path() -> None:
    from agentkernel.deployment.common import ThreadRunner as FromPackage
    from agentkernel.deployment.common.thread_runner import ThreadRunner as Upstream

    assert Upstream is ThreadRunner and FromPackage is ThreadRunner
    assert Upstream.shutdown_event is ThreadRunner.shutdown_event  # one process-wide event


def test_the_pipeline_modules_keep_upstreams_paths() -> None:
    from agentkernel.pipeline.io_handler import IOHandler
    from agentkernel.pipeline.process.io_handler import IOHandler as Ours
    from agentkernel.pipeline.thread_runner import ThreadRunner as Upstream

    assert Upstream is ThreadRunner and IOHandler is Ours


def test_the_factory_helpers_keep_their_core_util_path() -> None:
    from agentkernel.core.util.factory import AKConfigError as UpstreamError
    from agentkernel.core.util.factory import require_extra

    assert UpstreamError is AKConfigError
    with (
        pytest.raises(ImportError, match=r"pip install 'agentkernel\[kafka\]'"),
        require_extra("kafka", "execution.queues.type: kafka"),
    ):
        import agentkernel_no_such_module  # noqa: F401


def test_resolve_dotted_keeps_upstream_keywords() -> None:
    from agentkernel.core.util.factory import resolve_dotted
    from agentkernel.pipeline.transport.base import QueueTransport

    found = resolve_dotted(
        "agentkernel.pipeline.transport.in_memory.InMemoryTransport", base=QueueTransport
    )
    assert found is InMemoryTransport

    class SandboxConfigError(Exception):
        pass

    for bad in ("nodots", "agentkernel.nowhere.Thing", "agentkernel.core.config.AKConfig"):
        with pytest.raises(AKConfigError):
            resolve_dotted(bad, base=QueueTransport)
        with pytest.raises(SandboxConfigError):
            resolve_dotted(bad, base=QueueTransport, error=SandboxConfigError)


def test_execution_mode_compares_with_the_setting() -> None:
    from agentkernel.core.config import ExecutionMode

    mode_values = set(typing.get_args(ExecutionConfig.model_fields["mode"].annotation))
    assert {m.value for m in ExecutionMode} == mode_values  # one list of modes
    config = AKConfig(execution={"mode": ExecutionMode.REST_ASYNC})
    assert config.execution.mode == ExecutionMode.REST_ASYNC
    assert config.execution.mode == "rest_async"
    assert AKConfig().execution.mode == ExecutionMode.REST_SYNC
    with pytest.raises(ValueError):
        ExecutionMode("realtime")  # upstream's voice mode does not exist here


def test_the_underscore_config_models_are_this_packages_models() -> None:
    from agentkernel.core import config

    expected = {
        "_QueuesConfig": config.QueuesConfig,
        "_InputQueueConfig": config.InputQueueSettings,
        "_OutputQueueConfig": config.OutputQueueSettings,
        "_InMemoryQueueConfig": config.InMemoryQueueConfig,
        "_NatsQueueConfig": config.NatsQueueConfig,
        "_KafkaQueueConfig": config.KafkaQueueConfig,
        "_ResponseStoreConfig": config.ResponseStoreConfig,
        "_ResponseStoreRedisConfig": config.ResponseRedisConfig,
        "_ResponseStoreValkeyConfig": config.ResponseRedisConfig,
        "_ResponseStoreDynamoDBConfig": config.DynamoDBStoreConfig,
        "_RedisConfig": config.RedisStoreConfig,
        "_ValkeyConfig": config.RedisStoreConfig,
        "_DynamoDBConfig": config.DynamoDBStoreConfig,
        "_SessionStoreConfig": config.SessionConfig,
        "_ExecutionConfig": config.ExecutionConfig,
        "_APIConfig": config.ApiConfig,
        "_LoggingConfig": config.LoggingConfig,
        "_LogLevelConfig": config.LoggerConfig,
    }
    for name, model in expected.items():
        assert getattr(config, name) is model, name


def test_a_guide_shaped_block_built_from_underscore_models_reaches_the_factory() -> None:
    from agentkernel.core.config import _InputQueueConfig, _NatsQueueConfig, _QueuesConfig
    from agentkernel.pipeline.transport import QueueTransportFactory

    block = _QueuesConfig(
        type="nats",
        input=_InputQueueConfig(max_receive_count=2, no_of_consumers=3),
        nats=_NatsQueueConfig(url="nats://127.0.0.1:4222", partitions=4),
    )
    assert QueueTransportFactory.resolve_type(queues_config=block) == "nats"
    assert block.nats is not None and block.nats.partitions == 4
    with pytest.raises(ValueError, match="partitions"):
        _NatsQueueConfig(partitions=0)


def test_the_pipeline_and_transport_packages_export_upstreams_names() -> None:
    from agentkernel.pipeline import (
        AgentRunner,
        ConsumerLoop,
        InMemoryTransport,
        IOHandler,
        QueueMessage,
        QueueName,
        QueueTransport,
        QueueTransportFactory,
        RequestHandler,
        ResponseHandler,
        ThreadRunner,
        TransportConsumer,
    )
    from agentkernel.pipeline import transport as transports
    from agentkernel.pipeline.agent_runner import AgentRunner as Runner
    from agentkernel.pipeline.process.io_handler import IOHandler as IO
    from agentkernel.pipeline.transport import base

    assert AgentRunner is Runner and IOHandler is IO
    assert (QueueTransport, QueueTransportFactory, TransportConsumer) == (
        base.QueueTransport,
        base.QueueTransportFactory,
        base.TransportConsumer,
    )
    assert transports.InMemoryTransport is InMemoryTransport
    assert transports.QueueTransportFactory is QueueTransportFactory
    assert all((ConsumerLoop, QueueMessage, QueueName, RequestHandler, ResponseHandler))
    assert ThreadRunner.shutdown_event is not None
    with pytest.raises(AttributeError, match="WebSocketGateway"):
        transports.__getattr__("WebSocketGateway")
    with pytest.raises(ImportError):
        from agentkernel.pipeline import WebSocketGateway  # noqa: F401


def test_importing_the_old_paths_has_no_side_effect() -> None:
    """No FastAPI, no broker or store client, no transport module until a name is used."""
    code = (
        "import sys\n"
        "import agentkernel.pipeline, agentkernel.pipeline.transport, agentkernel.api\n"
        "import agentkernel.deployment.common, agentkernel.core.util.factory\n"
        "import agentkernel.deployment.common.thread_runner, agentkernel.pipeline.thread_runner\n"
        "heavy = ('fastapi', 'uvicorn', 'boto3', 'redis', 'nats', 'confluent_kafka', 'agents')\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in heavy]\n"
        "loaded += [m for m in sys.modules if m.startswith('agentkernel.pipeline.transport.')]\n"
        "import threading; print(sorted(loaded), threading.active_count())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] 1"


# -- ThreadRunner.run(max_workers=) ----------------------------------------------------------


def _counting_tasks(n: int) -> tuple[list[ThreadRunner.Task], list[int]]:
    lock, running, peak = threading.Lock(), [0], [0]

    def work(item: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        return item * 10

    tasks = [
        ThreadRunner.Task(execution_function=work, thread_name=f"w{i}", item=i + 1)
        for i in range(n)
    ]
    return tasks, peak


def test_max_workers_bounds_the_tasks_running_at_once() -> None:
    tasks, peak = _counting_tasks(5)
    results = ThreadRunner.run(tasks=tasks, max_workers=2)  # upstream's call
    assert results == {f"w{i}": (i + 1) * 10 for i in range(5)}
    assert peak[0] == 2
    tasks, peak = _counting_tasks(3)
    ThreadRunner.run(tasks, 1)  # upstream's positional order: tasks, max_workers
    assert peak[0] == 1
    tasks, peak = _counting_tasks(4)
    ThreadRunner.run(tasks)  # unbounded, as before
    assert peak[0] == 4


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "2"])
def test_max_workers_refuses_what_is_not_a_positive_int(bad: object) -> None:
    tasks, _ = _counting_tasks(1)
    with pytest.raises(ValueError, match="max_workers"):
        ThreadRunner.run(tasks, max_workers=bad)  # type: ignore[arg-type]


# -- QueueTransportFactory.create(queues_config=, config_path=) -------------------------------


SANDBOX = "sandbox.broker.queue"


def test_the_sandbox_broker_seam_builds_from_the_block_handed_to_it() -> None:
    from agentkernel.core.config import _QueuesConfig
    from agentkernel.pipeline.transport import QueueTransportFactory

    AKConfig.set(AKConfig(execution={"queues": {"type": "nats", "nats": {}}}))  # never read
    transport = QueueTransportFactory.create(
        queues_config=_QueuesConfig(type="in_memory"), config_path=SANDBOX
    )
    assert isinstance(transport, InMemoryTransport)
    consumer = QueueTransportFactory.create_consumer(
        QueueName.INPUT, queues_config={"type": "in_memory"}, config_path=SANDBOX
    )
    consumer.close()


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ({"type": "sqs"}, f"{SANDBOX}.input.url: required when {SANDBOX}.type is 'sqs'"),
        ({"type": "nats"}, f"{SANDBOX}.nats: block is required when {SANDBOX}.type is 'nats'"),
        ({"type": "kafka"}, f"{SANDBOX}.kafka: block is required"),
        ({"type": "bogus"}, f"{SANDBOX}.type: unknown transport 'bogus'"),
        ({"type": "no.such.Transport"}, f"{SANDBOX}.type: cannot import 'no.such.Transport'"),
        (
            {"type": "in_memory", "input": {"no_of_consumers": 0}},
            f"{SANDBOX}.input.no_of_consumers: ",
        ),
        ({"type": "in_memory", "typo": 1}, f"{SANDBOX}.typo: unknown key"),
    ],
)
def test_configuration_errors_name_keys_under_the_config_path(
    block: dict[str, object], expected: str
) -> None:
    from agentkernel.pipeline.transport.base import QueueTransportFactory

    with pytest.raises(AKConfigError) as caught:
        QueueTransportFactory.create(queues_config=block, config_path=SANDBOX)
    assert str(caught.value).startswith(expected), caught.value
    assert "execution.queues" not in str(caught.value)


@pytest.mark.parametrize("hostile", [42, "type: in_memory", ["in_memory"]])
def test_a_block_that_is_not_a_mapping_is_a_configuration_error(hostile: object) -> None:
    from agentkernel.pipeline.transport.base import QueueTransportFactory

    with pytest.raises(AKConfigError, match=f"^{SANDBOX}: expected a queues block"):
        QueueTransportFactory.create(queues_config=hostile, config_path=SANDBOX)  # type: ignore[arg-type]


def test_without_a_block_the_factory_reads_execution_queues_unchanged() -> None:
    from agentkernel.pipeline.transport.base import QueueTransportFactory

    AKConfig.set(AKConfig(execution={"queues": {"type": "nats"}}))
    with pytest.raises(AKConfigError) as caught:
        QueueTransportFactory.create()
    assert str(caught.value) == (
        "execution.queues.nats: block is required when execution.queues.type is 'nats'"
    )


def test_a_transport_error_raised_while_building_names_the_config_path(nats_url: str) -> None:
    """A NATS stream that does not exist (production: no auto-provisioning) is named under the
    block the caller handed in, not under execution.queues."""
    import uuid

    from agentkernel.pipeline.transport.base import QueueTransportFactory
    from agentkernel.pipeline.transport.nats import NatsTransport

    tag = uuid.uuid4().hex[:8].upper()
    block = {
        "type": "nats",
        "nats": {
            "url": nats_url,
            "input_stream": f"NOPE_IN_{tag}",
            "output_stream": f"NOPE_OUT_{tag}",
            "input_subject_prefix": f"nope.{tag}.req",
            "output_subject_prefix": f"nope.{tag}.out",
        },
    }
    try:
        with pytest.raises(AKConfigError) as caught:
            QueueTransportFactory.create_consumer(
                QueueName.INPUT, queues_config=block, config_path=SANDBOX
            )
    finally:
        NatsTransport.reset()
    assert str(caught.value).startswith(f"{SANDBOX}.nats"), caught.value
    assert f"NOPE_IN_{tag}" in str(caught.value)
