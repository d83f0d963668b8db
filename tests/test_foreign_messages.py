"""Foreign messages on a real broker: undecodable ones are answered and dead-lettered once, a
body naming another session than its group is refused, and no turn beside them is delayed.

Before the fix: on NATS the runner's fetch raised on such a message, which came back every
``ack_wait`` and stalled its partition for good; on Kafka a key that is not UTF-8 stopped the
buffering of its batch and the turns after it were lost, and a header that is not UTF-8 left its
record in flight for good; on SQS a binary attribute that is not UTF-8 failed every fetch of it.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentkernel import Agent, AgentRegistry
from agentkernel.core.agent import Turn
from agentkernel.core.config.execution import RunnerConfig
from agentkernel.core.config.queues import QueuesConfig
from agentkernel.pipeline.consumer.loop import ConsumerLoop
from agentkernel.pipeline.consumer.settings import LoopSettings
from agentkernel.pipeline.response_store.handler import ResponseHandler
from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore
from agentkernel.pipeline.runner.agent_runner import AgentRunner
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.transport.sync_face import SyncTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from tests import foreign
from tests.runner_config import config_with

Publish = Callable[[QueueTransport, QueueName, str, str, str], str | None]
SESSIONS = 3
TURNS = 4


@pytest.fixture(params=["in_memory", "nats", "kafka", "sqs", "redis"])
def broker(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[QueueTransport, Publish, tuple[str, ...]]]:
    kind = request.param
    if kind == "in_memory":
        transport: QueueTransport = InMemoryTransport()
        yield transport, _no_publish, ()
    elif kind == "nats":
        from agentkernel.pipeline.transport.nats import NatsTransport
        from tests.transports.test_nats import settings

        transport = NatsTransport(settings(request.getfixturevalue("nats_url"), ack_wait=30.0))
        yield transport, foreign.publish_nats, foreign.NATS_KINDS  # type: ignore[misc]
        NatsTransport.reset()
    elif kind == "kafka":
        from agentkernel.pipeline.transport.bookkeeping import InMemoryBookkeepingStore
        from agentkernel.pipeline.transport.kafka import KafkaTransport
        from tests.transports.test_kafka import kafka_settings

        bootstrap = request.getfixturevalue("tansu_broker").bootstrap
        transport = KafkaTransport(kafka_settings(bootstrap), InMemoryBookkeepingStore())
        yield transport, foreign.publish_kafka, foreign.KAFKA_KINDS  # type: ignore[misc]
    elif kind == "redis":
        from agentkernel.pipeline.transport.redis import RedisStreamsTransport
        from tests.transports.test_redis_streams import drop_keys, settings

        url = request.getfixturevalue("redis_url")
        config = settings(url, ack_wait=30.0)
        transport = RedisStreamsTransport(config)
        yield transport, foreign.publish_redis, foreign.REDIS_KINDS  # type: ignore[misc]
        drop_keys(url, config.prefix)
    else:
        request.getfixturevalue("aws")
        from tests.transports.test_sqs import fresh_transport

        transport = fresh_transport(30)
        yield transport, foreign.publish_sqs, foreign.SQS_KINDS  # type: ignore[misc]
    transport.close()


def _no_publish(*_: Any) -> str | None:
    raise AssertionError("nothing undecodable can be published in memory")


def counting(turn: Turn) -> str:
    turn.state["n"] = turn.state.get("n", 0) + 1
    return f"{turn.session_id}#{turn.state['n']}:{turn.prompt}"


class Pipeline:
    """A runner and a response handler on one transport, each on one consumer thread."""

    def __init__(self, transport: QueueTransport) -> None:
        registry = AgentRegistry()
        registry.register(Agent("count", counting))
        self.sessions = InMemorySessionStore()
        self.store = InMemoryResponseStore()
        runner = AgentRunner(
            config_with(RunnerConfig()), registry, transport=transport, sessions=self.sessions
        )
        handler = ResponseHandler(transport, self.store, QueuesConfig())
        self.stop = threading.Event()
        settings = LoopSettings(num_consumers=1, wait_seconds=1.0, drain_timeout=5.0)
        self.loops = [
            ConsumerLoop(
                runner.handling(),
                lambda: transport.create_consumer(QueueName.INPUT),
                settings,
                self.stop,
            ),
            ConsumerLoop(
                handler.handling(),
                lambda: transport.create_consumer(QueueName.OUTPUT),
                settings,
                self.stop,
            ),
        ]
        self.threads = [threading.Thread(target=loop.consume, daemon=True) for loop in self.loops]

    def __enter__(self) -> Pipeline:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def wait_for(self, request_ids: list[str], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = {r: self.store.get(r) for r in request_ids}
            if all(got.values()):
                return got
            time.sleep(0.1)
        return {r: self.store.get(r) for r in request_ids}


def turn_message(
    session: str, prompt: str, request_id: str, body_session: str | None = None
) -> QueueMessage:
    body = {"session_id": body_session or session, "prompt": prompt, "agent": "count"}
    return QueueMessage(
        body=json.dumps(body),
        attributes={"request_id": request_id},
        group_id=session,
        dedup_id=request_id,
    )


def test_foreign_messages_delay_nothing_and_are_answered(
    broker: tuple[QueueTransport, Publish, tuple[str, ...]],
) -> None:
    transport, publish, kinds = broker
    face = SyncTransport(transport)  # this thread sends as plain code does
    tag = uuid.uuid4().hex[:8]
    sessions = [f"s{i}-{tag}" for i in range(SESSIONS)]
    valid: list[str] = []
    refused: dict[str, int] = {}  # request id -> status its error reply must have
    with Pipeline(transport) as pipeline:
        for n in range(TURNS):
            for i, session in enumerate(sessions):
                rid = f"t{n}-{i}-{tag}"
                face.send(QueueName.INPUT, turn_message(session, str(n), rid))
                valid.append(rid)
                if n == 1:  # foreign messages between the turns of every session
                    for k, kind in enumerate(kinds):
                        for queue, status in ((QueueName.INPUT, 400), (QueueName.OUTPUT, 500)):
                            frid = f"f{k}-{queue}-{i}-{tag}"
                            if publish(transport, queue, kind, session, frid) is not None:
                                refused[frid] = status
                    mismatch = f"m-{i}-{tag}"
                    face.send(
                        QueueName.INPUT, turn_message(session, "x", mismatch, f"victim-{tag}")
                    )
                    refused[mismatch] = 400
        started = time.monotonic()
        got = pipeline.wait_for(valid + list(refused), timeout=30)
        waited = time.monotonic() - started
    missing = [r for r, record in got.items() if record is None]
    assert not missing, f"unanswered after {waited:.1f}s: {missing}"
    for session in sessions:  # every turn ran, once and in order
        results = [got[r].body["result"] for r in valid if session in got[r].body["session_id"]]
        assert results == [f"{session}#{n + 1}:{n}" for n in range(TURNS)]
    for rid, status in refused.items():
        assert got[rid].status_code == status, (rid, got[rid].body)
    assert pipeline.sessions.read(f"victim-{tag}").version == 0  # the mismatch never ran
