"""The scenarios, their bounds, and the tally line each one prints.

A scenario is a fault script run in a thread beside the workload. Bounds (see docs/chaos.md):
every turn answered once, each reply's list exact, no normal turn failed, the poison turn
answered with an error, no normal caller waiting longer than ``MAX_WAIT``, no process writing
more than ``LOG_RECORDS_PER_PROCESS`` log records, every SIGTERMed process exiting 0 within
``DRAIN_BOUND``; and the whole scenario ends within its ``CAP`` whatever happens.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.chaos.cluster import DRAIN_BOUND, Cluster
from tests.chaos.trace import write_timelines
from tests.chaos.workload import Turn, Workload

#: Seconds any normal turn may take, from its first POST to its answer as the caller sees it.
MAX_WAIT = float(os.environ.get("CHAOS_MAX_WAIT", "45"))
#: Seconds the workload may run (faults included) before what is left counts as unanswered.
#: A bound on the harness, not a product promise (that is ``MAX_WAIT`` per turn): at 60 s a
#: slow machine's ``sqs/sigterm-io`` (two IO drains of 21 s, each session's turns waiting them
#: out) sent a session's last planned turn at 60.2 s, which then counted as unanswered.
CAP = float(os.environ.get("CHAOS_CAP", "90"))
#: Log records one process (one incarnation) may write during a scenario; a quiet one writes
#: about ten, an outage of a few seconds with sensible retry logging a few dozen.
LOG_RECORDS_PER_PROCESS = 300
#: Turn of the workload that is the poison turn: (session number, turn number).
POISON_AT = (0, 3)
#: The poison turn crashes a runner on each of its ``max_receive_count`` (3) deliveries, and each
#: crash costs up to one lease, so that scenario may run two waits longer before the cap.
POISON_CAP = CAP + 2 * MAX_WAIT
#: The product's default lease (NATS ack_wait, SQS visibility timeout), in seconds.
DEFAULT_LEASE = 30.0
#: On NATS a session that shares the poison turn's partition waits behind each of its crashes
#: (one lease each: the partition's owner runs them side by side, and the turn crashes each
#: owner in turn), so the poison scenario's bound is two leases longer.
POISON_MAX_WAIT = MAX_WAIT + 2 * DEFAULT_LEASE
WARM_UP_SECONDS = 60.0

FaultScript = Callable[[Cluster, threading.Event], None]


def kill9(cluster: Cluster, stop: threading.Event) -> None:
    """``kill -9`` of a random runner every 2 s, four times; each is restarted at once."""
    for _ in range(4):
        if stop.wait(2.0):
            return
        cluster.kill_runner()


def sigterm_runners(cluster: Cluster, stop: threading.Event) -> None:
    """A rolling restart: each runner in turn is replaced, then sent SIGTERM, 1.5 s apart; the
    script ends when the last of them has exited (each exit is judged against the bound)."""
    draining: list[threading.Thread] = []
    for i in range(cluster.runner_count):
        if stop.wait(1.5):
            break
        draining.append(cluster.roll_runner(i))
    for waiter in draining:
        waiter.join()


def sigterm_io(cluster: Cluster, stop: threading.Event) -> None:
    """The IO process (the embedded server) is sent SIGTERM and started again, twice."""
    for _ in range(2):
        if stop.wait(2.5):
            return
        cluster.roll_io()


def broker_restart(cluster: Cluster, stop: threading.Event) -> None:
    """The broker (NATS file store, Redis append-only file, PostgreSQL) stops, stays down 2 s,
    and starts again with its data."""
    if not stop.wait(2.5):
        cluster.broker_restart(2.0)


def redis_outage(cluster: Cluster, stop: threading.Event) -> None:
    """Redis (replies, sessions, Kafka bookkeeping) is unreachable for 4 s."""
    if not stop.wait(2.5):
        cluster.redis_outage(4.0)


def calm(cluster: Cluster, stop: threading.Event) -> None:
    """No fault from outside (the poison scenario's crashes come from the turn itself)."""


SCENARIOS: dict[str, FaultScript] = {
    "kill9": kill9,
    "sigterm-runners": sigterm_runners,
    "sigterm-io": sigterm_io,
    "broker-restart": broker_restart,
    "redis-outage": redis_outage,
    "poison": calm,
    "calm": calm,  # no fault: a baseline for ad-hoc runs, not in the suite
}
TOPOLOGIES: dict[str, list[str]] = {
    # One process on the in-memory transport: a kill -9 or a poison turn takes every queued turn
    # with it by design, so only the planned and the store faults apply.
    "embedded": ["sigterm-io", "redis-outage"],
    "nats": ["kill9", "sigterm-runners", "sigterm-io", "broker-restart", "redis-outage", "poison"],
    "sqs": ["kill9", "sigterm-runners", "sigterm-io", "redis-outage", "poison"],
    "kafka": ["kill9", "sigterm-runners", "sigterm-io", "redis-outage", "poison"],
    # One server carries the queues and both stores, so a Redis outage is the broker restart
    # (Redis only), or has no Redis to stop (Postgres only): no redis-outage scenario.
    "redis": ["kill9", "sigterm-runners", "sigterm-io", "broker-restart", "poison"],
    "postgres": ["kill9", "sigterm-runners", "sigterm-io", "broker-restart", "poison"],
}
#: The scenarios whose sessions also send turns with multitask strategies (workload.py).
STRATEGY_SCENARIOS: dict[str, tuple[str, ...]] = {
    "embedded": ("sigterm-io",),
    **{topology: ("kill9",) for topology in ("nats", "sqs", "kafka", "redis", "postgres")},
}
#: sessions x turns per topology, scaled down from 100 x 10 to keep the suite under 10 minutes
#: on two cores; moto serves ~60-90 calls/s, so SQS runs a smaller load still.
LOAD: dict[str, tuple[int, int]] = {
    "embedded": (30, 10),
    "nats": (30, 10),
    "sqs": (15, 10),
    "kafka": (30, 10),
    # Smaller: ten more scenarios in about six minutes (each session still meets every fault).
    "redis": (10, 8),
    "postgres": (10, 8),
}


@dataclass
class Tally:
    """What one scenario's callers saw; ``line()`` is printed, ``violations()`` asserted."""

    label: str
    sent: int
    answered: int
    counts: dict[str, int]
    unanswered: int
    unsent: int
    max_wait: float
    poison: str
    log_records: dict[str, int]
    faults: int
    bad_exits: list[str]
    exits: list[float]
    cut: int
    fault_errors: list[str]
    crashes: int
    seconds: float
    errors: dict[str, int]
    #: With multitask strategies on: the outcomes of the paired turns (``None``: off).
    strategy_outcomes: dict[str, int] | None = None

    def line(self) -> str:
        c = self.counts
        logs = self.log_records.values()
        return (
            f"chaos {self.label}: answered {self.answered}/{self.sent}, lost {c['lost']}, "
            f"applied twice {c['applied twice']}, out of order {c['out of order']}, "
            f"unanswered {self.unanswered} (+{self.unsent} never sent), "
            f"max wait {self.max_wait:.1f}s (bound {self.wait_bound:g}s), "
            f"log records {sum(logs)} (max {max(logs, default=0)}/process, bound "
            f"{LOG_RECORDS_PER_PROCESS}); failed {c['failed']}{self._codes()}, "
            f"phantom {c['phantom']}, cut off {self.cut}, "
            f"changed {c['changed']}, poison {self.poison}, faults {self.faults}, "
            f"SIGTERM exits {len(self.exits)} (slowest {max(self.exits, default=0):.1f}s, "
            f"bad {len(self.bad_exits)}), crashes {self.crashes}, {self.seconds:.0f}s"
            + self._strategies()
        )

    def _strategies(self) -> str:
        if self.strategy_outcomes is None:
            return ""
        seen = ", ".join(f"{k} {n}" for k, n in sorted(self.strategy_outcomes.items()))
        return f"; paired turns: {seen or 'none'}"

    @property
    def wait_bound(self) -> float:
        return MAX_WAIT if self.poison == "-" else POISON_MAX_WAIT

    def _codes(self) -> str:
        codes = ", ".join(f"{code} {n}" for code, n in sorted(self.errors.items()))
        return f" ({codes})" if codes else ""

    def violations(self) -> list[str]:
        found = [f"{n} turns {what}" for what, n in self.counts.items() if n]
        if self.unanswered or self.unsent:
            found.append(f"{self.unanswered} turns unanswered, {self.unsent} never sent")
        if self.max_wait > self.wait_bound:
            found.append(f"a caller waited {self.max_wait:.1f}s > {self.wait_bound:g}s")
        if self.poison not in ("-", "error"):
            found.append(f"poison turn: {self.poison}")
        if self.cut:
            found.append(f"{self.cut} POSTs cut off without an answer (no JSON 503/504)")
        if self.strategy_outcomes is not None and not self.strategy_outcomes:
            found.append("multitask strategies were on, but no paired turn was answered")
        found += [f"the fault script failed: {e}" for e in self.fault_errors]
        found += [
            f"{name} wrote {n} log records > {LOG_RECORDS_PER_PROCESS}"
            for name, n in self.log_records.items()
            if n > LOG_RECORDS_PER_PROCESS
        ]
        return found + self.bad_exits


def cap_of(scenario: str) -> float:
    """Seconds the workload of ``scenario`` may run."""
    return POISON_CAP if scenario == "poison" else CAP


def run_scenario(
    topology: str,
    scenario: str,
    workdir: Path,
    cap: float = CAP,
    moto_url: str | None = None,
    kafka_bootstrap: str | None = None,
) -> Tally:
    """Start the topology, run the workload with the scenario's faults, tear everything down.

    The workload runs at most ``cap`` seconds; what is unanswered then is counted as such.
    """
    cluster = Cluster(topology, workdir, moto_url=moto_url, kafka_bootstrap=kafka_bootstrap)
    sessions, turns = _load(topology)
    poison = POISON_AT if scenario == "poison" else None
    strategies = scenario in STRATEGY_SCENARIOS.get(topology, ())
    workload = Workload(cluster.url, sessions, turns, cluster.deployment.tag, poison, strategies)
    stop = threading.Event()
    faults = threading.Thread(
        target=_faults, args=(scenario, cluster, stop, workload), name="faults"
    )
    started = time.monotonic()
    try:
        cluster.start()
        warm_up(cluster)
        started = time.monotonic()
        faults.start()
        asyncio.run(workload.run(cap))
    finally:
        stop.set()
        if faults.is_alive():
            faults.join(DRAIN_BOUND + 30)
        seconds = time.monotonic() - started
        cluster.close()
        write_timelines(
            workdir / "timelines.txt",
            workload.all_turns(),
            started,
            cluster.events.timeline,
            cluster.trace,
        )
    return tally(f"{topology}/{scenario}", workload, cluster, seconds)


def _faults(scenario: str, cluster: Cluster, stop: threading.Event, workload: Workload) -> None:
    try:
        SCENARIOS[scenario](cluster, stop)
    except Exception as exc:  # reported in the tally, not lost in a thread
        cluster.events.errors.append(repr(exc))
    finally:
        workload.faults_ended = time.monotonic()


def warm_up(cluster: Cluster) -> None:
    """One turn through the whole pipeline before the clock starts (runners joined, ready)."""
    client = cluster.deployment.client
    deadline = time.monotonic() + WARM_UP_SECONDS
    body = {"session_id": f"{cluster.deployment.tag}-warm-up", "prompt": "hi", "agent": "recorder"}
    while time.monotonic() < deadline:
        response = client.post("/api/v1/chat", json=body, headers={"Idempotency-Key": "w"})
        if response.status_code == 200:
            return
        time.sleep(0.5)
    raise AssertionError(f"no warm-up reply in {WARM_UP_SECONDS:g}s: {response.text}")


def tally(label: str, workload: Workload, cluster: Cluster, seconds: float) -> Tally:
    turns = workload.all_turns()
    normal = [t for t in turns if not t.poison and t.answered is not None]
    poison = [t for t in turns if t.poison]
    kinds = ("lost", "applied twice", "out of order", "failed", "phantom", "changed", "garbled")
    counts = {k: sum(k in t.problems for t in turns) for k in kinds}
    counts["poison answered without error"] = sum(
        "poison answered without error" in t.problems for t in turns
    )
    events = cluster.events
    return Tally(
        label=label,
        sent=sum(t.started is not None for t in turns),
        answered=sum(t.answered is not None for t in turns),
        counts=counts,
        unanswered=sum(t.started is not None and t.answered is None for t in turns),
        unsent=sum(t.started is None for t in turns),
        max_wait=max((t.wait for t in normal), default=0.0),
        poison=_poison_outcome(poison),
        log_records=cluster.log_records(),
        faults=len(events.faults),
        bad_exits=[
            f"{e.role} SIGTERM: exit {e.code} after {e.seconds:.1f}s"
            for e in events.exits
            if not e.clean
        ],
        exits=[e.seconds for e in events.exits],
        cut=sum(t.cuts for t in turns),
        fault_errors=events.errors,
        crashes=events.crashes,
        seconds=seconds,
        errors=dict(Counter(_code(t) for t in turns if "failed" in t.problems)),
        strategy_outcomes=_paired_outcomes(workload) if workload.strategies else None,
    )


def _paired_outcomes(workload: Workload) -> dict[str, int]:
    """How the paired turns ended: ``<strategy>: <outcome>`` for the turn sending the strategy,
    ``before <strategy>: <outcome>`` for the turn it met."""
    found: Counter[str] = Counter()
    for session in workload.turns:
        for index, turn in enumerate(session):
            if turn.strategy is None or turn.answered is None:
                continue
            found[f"{turn.strategy}: {_outcome(turn)}"] += 1
            met = session[index - 1]  # the turn right before it (coalesce: the queued one)
            if met.answered is not None:
                found[f"before {turn.strategy}: {_outcome(met)}"] += 1
    return dict(found)


def _outcome(turn: Turn) -> str:
    return "ok" if turn.status == 200 else str((turn.doc or {}).get("error", turn.status))


def _code(turn: Turn) -> str:
    doc = turn.doc or {}
    return f"{turn.status} {doc.get('error', '?')}"


def _poison_outcome(poison: list[Turn]) -> str:
    if not poison:
        return "-"
    (turn,) = poison
    if turn.answered is None:
        return "unanswered" if turn.started is not None else "never sent"
    return "error" if turn.status is not None and turn.status >= 500 else f"status {turn.status}"


def _load(topology: str) -> tuple[int, int]:
    sessions, turns = LOAD[topology]
    return (
        int(os.environ.get("CHAOS_SESSIONS", sessions)),
        int(os.environ.get("CHAOS_TURNS", turns)),
    )
