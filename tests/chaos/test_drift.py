"""Chaos: the NATS partition count changed under a running IO process.

A split deployment (IO process + two runners, the default 32 partitions) serves a workload; the
operator halves the count following docs/transports.md ("Changing the partition count"),
but forgets the IO process:

1. intake stops (no session sends a new turn) and both streams drain to 0 messages;
2. every runner is stopped; the IO process is forgotten and keeps running with 32;
3. both streams are deleted and the first process of the new count declares them again;
4. the runners start with 16 and intake resumes, still to the forgotten IO process.

Its publishes to partitions 16-31 are refused by the broker at once; within the watch's interval
(5 s) it must log one ERROR per queue naming both counts, fail ``/ready`` and refuse every turn
with 503. A runner started with the old count must refuse to start with one line. The operator
then replaces the IO process with one of the new count, and every session must be answered
again: no accepted turn lost, applied twice or left unanswered, nothing left in the streams.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentkernel.core.config.queues import NatsQueueConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.pipeline.transport.nats import NatsTransport, partition_of
from agentkernel.pipeline.transport.nats.watch import CHECK_SECONDS
from tests.chaos import budget
from tests.chaos.cluster import AGENTS, Cluster
from tests.chaos.scenarios import Tally, tally, warm_up
from tests.chaos.trace import PARTITIONS, write_timelines
from tests.chaos.workload import SYNC_TIMEOUT, Turn, Workload

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.redis,
    pytest.mark.nats,
    budget.load(),
]

SESSIONS, TURNS = 12, 6
NEW_PARTITIONS = PARTITIONS // 2
COUNT_VARIABLE = "AK_EXECUTION__QUEUES__NATS__PARTITIONS"
#: Seconds the workload may run; it usually ends within twenty-five.
WANTED = 40.0
#: Seconds of traffic on the old count before the operator starts.
BEFORE = 3.0
DRAIN_SECONDS = 20.0
#: The forgotten IO process must notice within one watch interval; 2 s for the probe's poll.
NOTICE_BOUND = CHECK_SECONDS + 2
STALE_START_SECONDS = 30.0
HELD = re.compile(r"answering (\d+) waiting requests 503")


class GatedWorkload(Workload):
    """A workload whose intake the operator can stop: no turn is sent while it is closed.

    A turn's wait starts when it is sent, so the time intake stays closed is not counted as a
    caller's wait (it is printed apart).
    """

    def __init__(self, url: str, sessions: int, turns: int, tag: str) -> None:
        super().__init__(url, sessions, turns, tag)
        self.intake = threading.Event()
        self.intake.set()
        self.in_flight = 0

    async def _drive(self, client: httpx.AsyncClient, turn: Turn, deadline: float) -> None:
        while not self.intake.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        self.in_flight += 1
        try:
            await super()._drive(client, turn, deadline)
        finally:
            self.in_flight -= 1


@dataclass
class Drift:
    """What the operator saw of the forgotten IO process and of a process with the old count."""

    notice: float | None = None  # seconds from the new streams to /ready 503
    ready: str = "-"  # what /ready said then
    probe: str = "-"  # a new turn's answer once /ready failed
    probe_body: dict[str, str] = field(default_factory=dict)
    probe_retry: str = "-"  # the same turn retried on the replacement IO process
    errors: int = 0  # ERROR records of the forgotten IO process naming both counts
    held: int = 0  # accepted turns the forgotten IO process still waited for when replaced
    stale_start: str = "-"
    intake_stopped: float = 0.0
    problems: list[str] = field(default_factory=list)


def config_of(env: dict[str, str], partitions: int) -> NatsQueueConfig:
    prefix = "AK_EXECUTION__QUEUES__NATS__"
    fields = ("url", "input_stream", "input_subject_prefix", "output_stream")
    settings: dict[str, Any] = {f: env[prefix + f.upper()] for f in fields}
    settings["output_subject_prefix"] = env[prefix + "OUTPUT_SUBJECT_PREFIX"]
    return NatsQueueConfig(**settings, partitions=partitions, auto_provision=True)


def streams_of(monitor_url: str) -> dict[str, dict[str, Any]]:
    """Each stream's ``/jsz`` detail (state and consumers) on the private server."""
    with urllib.request.urlopen(f"{monitor_url}/jsz?consumers=true", timeout=2) as response:
        doc = json.load(response)
    return {
        stream["name"]: stream
        for account in doc.get("account_details") or []
        for stream in account.get("stream_detail") or []
    }


def messages_of(cluster: Cluster, names: tuple[str, str]) -> int:
    assert cluster.nats is not None
    streams = streams_of(cluster.nats.monitor_url)
    return sum(int(streams[n]["state"]["messages"]) for n in names if n in streams)


def stalled_of(cluster: Cluster, names: tuple[str, str]) -> int:
    """Partition consumers still holding work: messages pending or unacknowledged."""
    assert cluster.nats is not None
    return sum(
        1
        for name, stream in streams_of(cluster.nats.monitor_url).items()
        if name in names
        for consumer in stream.get("consumer_detail") or []
        if consumer.get("num_pending", 0) or consumer.get("num_ack_pending", 0)
    )


def wait_for(what: str, done: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g}s")
        time.sleep(0.2)


def reprovision(old: NatsQueueConfig, new: NatsQueueConfig) -> None:
    """Step 4: delete both streams; the first process of the new count declares them again.

    The forgotten IO process (``auto_provision``) may recreate a stream with its old count in
    the few milliseconds between; the new one then refuses to start, and the operator deletes
    again, as docs/transports.md says.
    """
    for _ in range(5):
        transport = NatsTransport(old.model_copy(update={"auto_provision": False}))
        try:
            for stream in (old.input_stream, old.output_stream):
                transport.run(transport.conn.js.delete_stream(stream))
            NatsTransport(new)
            return
        except AKConfigError:
            continue
        finally:
            NatsTransport.reset()
    raise AssertionError("the forgotten IO process kept recreating the old streams")


def change_count(cluster: Cluster, workload: GatedWorkload, drift: Drift) -> None:
    """The operator's procedure, with the IO process forgotten; then its replacement."""
    env = cluster.deployment.env
    old, new = config_of(env, PARTITIONS), config_of(env, NEW_PARTITIONS)
    names = (old.input_stream, old.output_stream)
    time.sleep(BEFORE)
    workload.intake.clear()
    stopped = time.monotonic()
    cluster.events.fault("intake stopped")
    wait_for("intake drained", lambda: workload.in_flight == 0, DRAIN_SECONDS)
    wait_for("streams drained", lambda: messages_of(cluster, names) == 0, DRAIN_SECONDS)
    cluster.stop_runners()
    reprovision(old, new)
    changed = time.monotonic()
    cluster.events.fault(f"streams re-provisioned for {NEW_PARTITIONS} partitions")
    env[COUNT_VARIABLE] = str(NEW_PARTITIONS)
    cluster.start_runners()
    workload.intake.set()
    drift.intake_stopped = time.monotonic() - stopped
    watch_forgotten_io(cluster, drift, changed)
    drift.stale_start = start_stale_runner(cluster)
    cluster.roll_io()
    drift.probe_retry = retry_probe(cluster, drift)


def watch_forgotten_io(cluster: Cluster, drift: Drift, changed: float) -> None:
    """/ready of the forgotten IO process, then a new turn sent to it."""
    client = cluster.deployment.client
    deadline = changed + NOTICE_BOUND
    while time.monotonic() < deadline:
        ready = client.get("/ready")
        if ready.status_code == 503:  # /ready names the check, never the error's text
            drift.notice = time.monotonic() - changed
            drift.ready = str(ready.json().get("message"))
            break
        time.sleep(0.2)
    tag = cluster.deployment.tag
    session = next(
        s for i in range(1000) if partition_of(s := f"{tag}-probe{i}", PARTITIONS) == 0
    )  # a partition both counts have: only the watch can refuse it
    body = {"session_id": session, "prompt": "probe", "agent": "recorder"}
    probe = client.post("/api/v1/chat", json=body, headers={"Idempotency-Key": "probe"})
    drift.probe = f"{probe.status_code} {probe.json().get('error', '')}".strip()
    drift.probe_body = body


def retry_probe(cluster: Cluster, drift: Drift) -> str:
    """The refused turn retried with its Idempotency-Key on the new IO process: it must run."""
    headers = {"Idempotency-Key": "probe"}
    deadline = time.monotonic() + 15
    while True:
        retry = cluster.deployment.client.post(
            "/api/v1/chat", json=drift.probe_body, headers=headers
        )
        code = f"{retry.status_code} {retry.json().get('error', '')}".strip()
        if retry.status_code != 503 or time.monotonic() > deadline:
            return code
        time.sleep(0.5)


def start_stale_runner(cluster: Cluster) -> str:
    """A runner of the old count (a stale replica) must refuse to start with one line."""
    deployment = cluster.deployment
    proc = deployment.runner(AGENTS, env={COUNT_VARIABLE: str(PARTITIONS)})
    try:
        code = proc.wait(STALE_START_SECONDS)
    except Exception:
        proc.kill()
        return "NOT refused (still running)"
    lines = deployment.logs[-1].read_text().splitlines()
    named = [line for line in lines if f"partitions is {PARTITIONS} but" in line]
    if code == 0 or len(named) != 1 or any("Traceback" in line for line in lines):
        return f"NOT refused in one line (exit {code}, {len(named)} lines name the count)"
    return f"refused (exit {code}, one line)"


def read_forgotten_io_log(cluster: Cluster, drift: Drift) -> None:
    """ERROR records of the first IO process (the forgotten one) naming both counts, and the
    accepted turns it still held when it was replaced (their replies wait in OUTPUT)."""
    log = next(p for p in cluster.deployment.logs if p.name.startswith("io-"))
    lines = log.read_text().splitlines()
    needle = f"partitions is {PARTITIONS} but"
    drift.errors = sum(" ERROR " in line and needle in line for line in lines)
    held = (HELD.search(line) for line in lines)
    drift.held = sum(int(m.group(1)) for m in held if m)


def _faults(cluster: Cluster, workload: GatedWorkload, drift: Drift) -> None:
    try:
        change_count(cluster, workload, drift)
    except Exception as exc:  # reported in the tally, not lost in a thread
        cluster.events.errors.append(repr(exc))
    finally:
        workload.intake.set()
        workload.faults_ended = time.monotonic()


@dataclass
class DriftTally:
    """The usual tally of the callers, and what the drift showed."""

    base: Tally
    accepted: int
    refused: int
    stalled: int
    left: int
    drift: Drift

    def line(self) -> str:
        b, d = self.base, self.drift
        notice = "never" if d.notice is None else f"{d.notice:.1f}s"
        return (
            f"chaos nats/partitions-changed: accepted {self.accepted}, answered {b.answered}, "
            f"lost {b.counts['lost']}, applied twice {b.counts['applied twice']}, "
            f"out of order {b.counts['out of order']}, unanswered {b.unanswered} "
            f"(+{b.unsent} never sent), failed {b.counts['failed']}, refused 503 "
            f"{self.refused}, stalled partitions {self.stalled} ({self.left} messages left), "
            f"/ready 503 within {notice} (bound {NOTICE_BOUND:g}s: {d.ready}), "
            f"ERROR lines {d.errors}, held when replaced {d.held}, "
            f"new turn then {d.probe} (retried on the new IO: {d.probe_retry}), old-count "
            f"runner {d.stale_start}, intake stopped {d.intake_stopped:.1f}s, "
            f"max wait {b.max_wait:.1f}s (bound {b.wait_bound:g}s), "
            f"SIGTERM exits {len(b.exits)} (bad {len(b.bad_exits)}); {b.seconds:.0f}s"
        )

    def violations(self) -> list[str]:
        d = self.drift
        found = self.base.violations()
        if self.accepted != self.base.answered:
            found.append(f"{self.accepted} turns accepted but {self.base.answered} answered")
        if self.stalled or self.left:
            found.append(f"{self.stalled} partitions stalled, {self.left} messages left")
        if d.notice is None:
            found.append(f"the forgotten IO process kept /ready 200 for {NOTICE_BOUND:g}s")
        if d.probe != "503 QUEUE_UNAVAILABLE":
            found.append(f"a new turn sent to the forgotten IO process got {d.probe}")
        if d.probe_retry != "200":
            found.append(f"the refused turn retried on the new IO process got {d.probe_retry}")
        if d.errors not in (1, 2):  # one per queue at most: the fault is logged once
            found.append(f"the forgotten IO process logged {d.errors} ERROR lines naming counts")
        if not d.stale_start.startswith("refused"):
            found.append(f"a runner with the old count: {d.stale_start}")
        return found


def run_drift(workdir: Path, cap: float) -> DriftTally:
    cluster = Cluster("nats", workdir, runners=2)
    workload = GatedWorkload(cluster.url, SESSIONS, TURNS, cluster.deployment.tag)
    drift = Drift()
    fault = threading.Thread(target=_faults, args=(cluster, workload, drift), daemon=True)
    started = time.monotonic()
    settings = config_of(cluster.deployment.env, PARTITIONS)
    names = (settings.input_stream, settings.output_stream)
    stalled = left = -1
    try:
        cluster.start()
        warm_up(cluster)
        started = time.monotonic()
        fault.start()
        asyncio.run(workload.run(cap))
        fault.join(SYNC_TIMEOUT)
        settled = time.monotonic() + 5
        while (left := messages_of(cluster, names)) and time.monotonic() < settled:
            time.sleep(0.2)  # the last replies are being acknowledged
        stalled = stalled_of(cluster, names)
        read_forgotten_io_log(cluster, drift)
    finally:
        workload.intake.set()
        seconds = time.monotonic() - started
        cluster.close()
        write_timelines(
            workdir / "timelines.txt",
            workload.all_turns(),
            started,
            cluster.events.timeline,
            cluster.trace,
        )
    base = tally("nats/partitions-changed", workload, cluster, seconds)
    accepted = sum(t.accepted for t in workload.all_turns())
    refused = workload.refused["QUEUE_UNAVAILABLE"]
    return DriftTally(base, accepted, refused, stalled, left, drift)


@pytest.mark.timeout(WANTED + SYNC_TIMEOUT + 120)
def test_partition_count_changed_under_a_running_io(
    request: pytest.FixtureRequest, tmp_path: Path, record_tally: Callable[[str], None]
) -> None:
    cap = budget.cap(request.config, WANTED)
    workdir = Path(os.environ.get("CHAOS_WORKDIR", tmp_path)) / "nats-partitions-changed"
    shutil.rmtree(workdir, ignore_errors=True)
    result = run_drift(workdir, cap)
    record_tally(result.line())
    problems = result.violations()
    assert not problems, "\n".join([result.line(), *problems, f"logs: {workdir / 'logs'}"])
