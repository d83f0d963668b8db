"""Chaos: foreign messages on INPUT and OUTPUT of each transport, among 60 turns.

A runner and a response handler (one consumer thread each, default leases) serve three sessions
of 20 turns; between every fifth turn of each session come messages the transport cannot decode,
of every kind its broker can carry, on both queues, and a turn whose body names another session.
The tally line counts turns lost (never answered), foreign messages with a readable request id
left unanswered, sessions ("partitions") whose turns stalled, and the longest wait of a turn.
"""

from __future__ import annotations

import time
import uuid

import pytest

from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.transport.sync_face import SyncTransport
from agentkernel.pipeline.wire.envelope import QueueName
from tests.chaos import budget
from tests.test_foreign_messages import Pipeline, Publish, broker, turn_message

__all__ = ["broker"]  # the fixture, shared with the regression test

pytestmark = [pytest.mark.chaos, budget.waits()]

SESSIONS, TURNS, EVERY = 3, 20, 5
WANTED_CAP = 45.0


@pytest.mark.timeout(WANTED_CAP + 60)
def test_foreign_messages(
    broker: tuple[QueueTransport, Publish, tuple[str, ...]], request: pytest.FixtureRequest
) -> None:
    transport, publish, kinds = broker
    face = SyncTransport(transport)  # this thread sends as plain code does
    cap = budget.cap(request.config, WANTED_CAP)
    tag = uuid.uuid4().hex[:8]
    sent: dict[str, float] = {}
    foreign: list[str] = []
    with Pipeline(transport) as pipeline:
        for n in range(TURNS):
            for i in range(SESSIONS):
                session = f"s{i}-{tag}"
                rid = f"t{n}-{i}-{tag}"
                face.send(QueueName.INPUT, turn_message(session, str(n), rid))
                sent[rid] = time.monotonic()
                if n % EVERY == 2:
                    foreign += _publish_foreign(transport, publish, kinds, session, f"{n}-{i}")
        answered: dict[str, float] = {}
        deadline = time.monotonic() + cap
        while time.monotonic() < deadline and len(answered) < len(sent) + len(foreign):
            for rid in [*sent, *foreign]:
                if rid not in answered and pipeline.store.get(rid) is not None:
                    answered[rid] = time.monotonic()
            time.sleep(0.05)
    lost = [r for r in sent if r not in answered]
    unanswered = [r for r in foreign if r not in answered]
    stalled = {r.split("-")[1] for r in lost}
    waits = [answered[r] - sent[r] for r in sent if r in answered]
    line = (
        f"foreign[{type(transport).__name__}]: {len(sent)} turns, {len(foreign)} foreign, "
        f"lost {len(lost)}, unanswered {len(unanswered)}, stalled partitions {len(stalled)}, "
        f"max wait {max(waits, default=0.0):.1f}s"
    )
    print(f"\n{line}")
    assert not (lost or unanswered), line
    assert max(waits) < 15.0, line  # a stall costs a lease (30 s) or forever


def _publish_foreign(
    transport: QueueTransport, publish: Publish, kinds: tuple[str, ...], session: str, at: str
) -> list[str]:
    ids = []
    for k, kind in enumerate(kinds):
        for queue in QueueName:
            rid = f"f{k}-{queue}-{at}"
            if publish(transport, queue, kind, session, rid) is not None:
                ids.append(rid)
    mismatch = f"m-{at}"
    SyncTransport(transport).send(
        QueueName.INPUT, turn_message(session, "x", mismatch, f"victim-{at}")
    )
    return [*ids, mismatch]
