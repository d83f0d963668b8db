"""Importing the core never drags in an optional dependency."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

OPTIONAL = (
    "boto3",
    "botocore",
    "nats",
    "confluent_kafka",
    "redis",
    "psycopg",
    "psycopg_pool",
    "agents",
    "openai",
    "opentelemetry",
)
CORE_MODULES = (
    "agentkernel",
    "agentkernel.core.config",
    "agentkernel.pipeline",
    "agentkernel.pipeline.envelope",
    "agentkernel.pipeline.consumer.loop",
    "agentkernel.pipeline.process.thread_runner",
    "agentkernel.pipeline.transport.base",
    "agentkernel.pipeline.transport.in_memory",
    # upstream's import paths
    "agentkernel.pipeline.transport",
    "agentkernel.deployment.common.thread_runner",
    "agentkernel.core.util.factory",
    "agentkernel.api",
    "agentkernel.pipeline.agent_runner",
    "agentkernel.pipeline.runtime.tracing",
    "agentkernel.pipeline.front.chat_front",
    "agentkernel.pipeline.consumer.handling",
    "agentkernel.pipeline.runner.agent_runner",
    "agentkernel.core.config.root",
)


def test_core_modules_import_no_optional_dependency() -> None:
    code = (
        "import sys\n"
        f"for name in {CORE_MODULES!r}: __import__(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {OPTIONAL!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_missing_extra_is_named_with_the_install_command() -> None:
    code = (
        "import sys\n"
        "sys.modules['nats'] = None  # as if nats-py were not installed\n"
        "from agentkernel.pipeline.transport.base import QueueTransportFactory\n"
        "try:\n"
        "    QueueTransportFactory.create({'type': 'nats', 'nats': {}})\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "execution.queues.type: nats requires the 'nats' extra: pip install 'agentkernel[nats]'"
    )


def test_the_public_names_import_from_their_documented_paths() -> None:
    from agentkernel import Agent, Module, RetryableError, Turn
    from agentkernel.aws import (
        ECSAgentRunner,
        ECSIOHandler,
        ECSOutputConsumer,
        ECSQueueRequestHandler,
        ECSSQSConsumer,
        QueueConsumer,
    )
    from agentkernel.core.config import AKConfig, AKConfigError, require_extra
    from agentkernel.pipeline import ConsumerLoop, QueueMessage, QueueName, ThreadRunner
    from agentkernel.pipeline.testing import QueueTransportContract
    from agentkernel.pipeline.transport.base import (
        QueueTransport,
        QueueTransportFactory,
        TransportConsumer,
    )
    from agentkernel.pipeline.transport.bookkeeping import BookkeepingStore
    from agentkernel.pipeline.transport.in_memory import InMemoryTransport

    assert issubclass(ECSAgentRunner, QueueConsumer) and issubclass(
        ECSOutputConsumer, ECSSQSConsumer
    )
    assert issubclass(InMemoryTransport, QueueTransport)
    assert {QueueName.INPUT.value, QueueName.OUTPUT.value} == {"input", "output"}
    assert all(
        (
            Agent,
            Module,
            RetryableError,
            Turn,
            ECSIOHandler,
            ECSQueueRequestHandler,
            AKConfig,
            AKConfigError,
            require_extra,
            ConsumerLoop,
            QueueMessage,
            ThreadRunner,
            QueueTransportContract,
            QueueTransportFactory,
            TransportConsumer,
            BookkeepingStore,
        )
    )


#: Upstream's import paths (and this project's documented ones) that moved into packages: each
#: is a face that re-exports the same object from where it lives now.
FACES = {
    "agentkernel.pipeline.agent_runner": (
        "AgentRunner",
        "agentkernel.pipeline.runner.agent_runner",
    ),
    "agentkernel.pipeline.envelope": ("QueueMessage", "agentkernel.pipeline.wire.envelope"),
    "agentkernel.pipeline.io_handler": ("IOHandler", "agentkernel.pipeline.process.io_handler"),
    "agentkernel.pipeline.request_handler": (
        "RequestHandler",
        "agentkernel.pipeline.http.request_handler",
    ),
    "agentkernel.pipeline.response_handler": (
        "ResponseHandler",
        "agentkernel.pipeline.response_store.handler",
    ),
    "agentkernel.pipeline.thread_runner": (
        "ThreadRunner",
        "agentkernel.pipeline.runtime.thread_runner",
    ),
    "agentkernel.pipeline.process.thread_runner": (
        "ThreadRunner",
        "agentkernel.pipeline.runtime.thread_runner",
    ),
    "agentkernel.deployment.common.thread_runner": (
        "ThreadRunner",
        "agentkernel.pipeline.runtime.thread_runner",
    ),
    "agentkernel.pipeline.transport.base": (
        "QueueTransportFactory",
        "agentkernel.pipeline.transport.factory",
    ),
    "agentkernel.core.config": ("AKConfig", "agentkernel.core.config.root"),
    "agentkernel.cli": ("main", "agentkernel.cli.commands"),
}


def test_the_old_paths_are_faces_of_the_same_objects() -> None:
    import importlib

    for path, (name, home) in FACES.items():
        face, real = importlib.import_module(path), importlib.import_module(home)
        assert getattr(face, name) is getattr(real, name), path


def test_a_face_module_defines_nothing() -> None:
    import ast
    import importlib

    for path in FACES:
        module = importlib.import_module(path)
        if path.endswith(("transport.base", ".config", ".cli")):  # real modules and packages
            continue
        source = Path(module.__file__ or "").read_text()
        assert source.count("\n") < 40, path
        for node in ast.parse(source).body:
            assert isinstance(node, ast.Expr | ast.Import | ast.ImportFrom | ast.Assign), path
            if isinstance(node, ast.Assign):
                assert [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__all__"]
