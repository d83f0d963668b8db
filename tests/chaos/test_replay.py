"""Chaos: a replay longer than the session record's id window applies nothing twice.

One runner, one ordering unit: a ``SLOW`` turn of one session is in flight while another
session finishes ``QUICK_TURNS`` (more than the 64 ids a record remembers) quick turns behind
it; then the runner is killed (``kill -9``) and replaced. On Kafka with in-memory bookkeeping
(the hardest choice: the replacement forgets which records were finished) the committed offset
could not pass the slow turn, so every quick turn is delivered again; each must be recognised by
its position and not applied again. On NATS the acknowledged turns are gone from the work queue,
so the same fault must simply leave nothing lost or doubled. Prints the usual tally line.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agentkernel.pipeline.transport.nats.transport import partition_of
from tests.chaos import budget
from tests.chaos.agents import SLOW
from tests.chaos.cluster import Cluster
from tests.chaos.scenarios import Tally, tally, warm_up
from tests.chaos.trace import PARTITIONS
from tests.chaos.workload import SYNC_TIMEOUT, Turn, Workload

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.redis]

QUICK_TURNS = 70
#: Seconds the scenario's workload may run: the slow turn (15 s), run again after the kill.
CAP = 50.0
NATS_PARTITIONS = PARTITIONS  # the cluster's count (the product default)
#: The slow turn's length: on NATS a killed runner's turn comes back after the 30 s lease, and
#: the caller's bound (45 s) must still hold for the turn run again; Kafka has no lease.
ENV = {
    "kafka": {
        "AK_EXECUTION__QUEUES__KAFKA__PARTITIONS": "1",
        "AK_EXECUTION__QUEUES__KAFKA__BOOKKEEPING": "in_memory",
        "CHAOS_SLOW_SECONDS": "15",
    },
    "nats": {"CHAOS_SLOW_SECONDS": "8"},
}
CASES = [
    pytest.param(
        "kafka", marks=[pytest.mark.kafka, budget.waits("kafka")], id="kafka-replay-past-window"
    ),
    pytest.param(
        "nats", marks=[pytest.mark.nats, budget.waits("nats")], id="nats-replay-past-window"
    ),
]


def sessions_apart(tag: str) -> tuple[str, str]:
    """A slow and a quick session id; on NATS in different partitions, so neither waits."""
    slow = f"{tag}-slow"
    quick = next(
        f"{tag}-quick{i}"
        for i in range(100)
        if partition_of(f"{tag}-quick{i}", NATS_PARTITIONS) != partition_of(slow, NATS_PARTITIONS)
    )
    return slow, quick


def workload_of(cluster: Cluster) -> Workload:
    tag = cluster.deployment.tag
    workload = Workload(cluster.url, 2, QUICK_TURNS, tag)
    slow, quick = sessions_apart(tag)
    workload.turns = [
        [Turn(slow, 0, SLOW)],
        [Turn(quick, i, f"p{i}") for i in range(QUICK_TURNS)],
    ]
    return workload


def kill_behind_the_slow_turn(cluster: Cluster, workload: Workload, stop: threading.Event) -> None:
    """Once the quick session has all its turns answered, ``kill -9`` the one runner."""
    try:
        deadline = time.monotonic() + CAP - 20
        quick = workload.turns[1]
        while sum(t.answered is not None for t in quick) < QUICK_TURNS:
            if stop.wait(0.2) or time.monotonic() > deadline:
                cluster.events.errors.append("the quick turns did not finish before the kill")
                return
        cluster.kill_runner()
    except Exception as exc:  # reported in the tally
        cluster.events.errors.append(repr(exc))
    finally:
        workload.faults_ended = time.monotonic()


def run_replay(topology: str, workdir: Path, cap: float, kafka: str | None) -> Tally:
    cluster = Cluster(topology, workdir, runners=1, kafka_bootstrap=kafka)
    cluster.deployment.env |= ENV[topology] | {"CHAOS_TURN_SECONDS": "0.02"}
    workload = workload_of(cluster)
    stop = threading.Event()
    fault = threading.Thread(target=kill_behind_the_slow_turn, args=(cluster, workload, stop))
    started = time.monotonic()
    try:
        cluster.start()
        warm_up(cluster)
        started = time.monotonic()
        fault.start()
        asyncio.run(workload.run(cap))
    finally:
        stop.set()
        if fault.is_alive():
            fault.join(10)
        seconds = time.monotonic() - started
        cluster.close()
    return tally(f"{topology}/replay-past-window", workload, cluster, seconds)


@pytest.mark.timeout(CAP + SYNC_TIMEOUT + 120)
@pytest.mark.parametrize("topology", CASES)
def test_replay_past_window(
    topology: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    record_tally: Callable[[str], None],
) -> None:
    kafka = request.getfixturevalue("tansu_broker").bootstrap if topology == "kafka" else None
    cap = budget.cap(request.config, CAP)
    workdir = Path(os.environ.get("CHAOS_WORKDIR", tmp_path)) / f"{topology}-replay"
    shutil.rmtree(workdir, ignore_errors=True)
    result = run_replay(topology, workdir, cap, kafka)
    record_tally(result.line())
    problems = result.violations()
    assert not problems, "\n".join([result.line(), *problems, f"logs: {workdir / 'logs'}"])
