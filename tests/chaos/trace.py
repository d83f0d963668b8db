"""Evidence for a failed or slow scenario: the broker's view and each slow turn's timeline.

A NATS scenario polls the private server's monitoring endpoint (``/jsz``) and writes every change
of a partition consumer's counters (delivered, ack floor, pending acks, redeliveries, waiting
pull requests) to ``nats-trace.jsonl``. When the scenario ends, ``timelines.txt`` lists every turn
that waited longer than ``SLOW_SECONDS`` or was never answered, with the faults and the trace
rows of its session's partitions during its wait. Reading it tells a turn held by a killed runner
(delivered just before a kill, redelivered one ``ack_wait`` later) from a delivery nobody
received (delivered with no fault near, redelivered one ``ack_wait`` later).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentkernel.core.config.queues import NatsQueueConfig
from agentkernel.pipeline.transport.nats import partition_of
from tests.chaos.workload import Turn

POLL_SECONDS = 0.25
SLOW_SECONDS = 20.0
PARTITIONS = NatsQueueConfig().partitions  # the product's default; the suite keeps it
FIELDS = ("delivered", "ack_floor", "num_ack_pending", "num_redelivered", "num_waiting")


@dataclass
class Row:
    """A partition consumer's counters at ``t`` (seconds on the scenario's monotonic clock)."""

    t: float
    consumer: str
    state: dict[str, Any]


class NatsTrace:
    """Polls ``/jsz`` of one server in a thread; keeps the rows in which a consumer changed."""

    def __init__(self, monitor_url: str, path: Path) -> None:
        self.url = f"{monitor_url}/jsz?consumers=true"
        self.path = path
        self.rows: list[Row] = []
        self.errors = 0
        self._last: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nats-trace", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with self.path.open("w") as f:
            for row in self.rows:
                f.write(json.dumps({"t": round(row.t, 3), "c": row.consumer, **row.state}) + "\n")

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                with urllib.request.urlopen(self.url, timeout=2) as response:
                    doc = json.load(response)
            except (OSError, ValueError):
                self.errors += 1  # the server is down (a broker restart) or busy
                continue
            self._record(time.monotonic(), doc)

    def _record(self, now: float, doc: dict[str, Any]) -> None:
        for account in doc.get("account_details") or []:
            for stream in account.get("stream_detail") or []:
                for consumer in stream.get("consumer_detail") or []:
                    state = {
                        "delivered": consumer["delivered"]["stream_seq"],
                        "ack_floor": consumer["ack_floor"]["stream_seq"],
                        **{k: consumer.get(k, 0) for k in FIELDS[2:]},
                    }
                    name = consumer["name"]
                    if self._last.get(name) != state:
                        self._last[name] = state
                        self.rows.append(Row(now, name, state))


def write_timelines(
    path: Path,
    turns: list[Turn],
    started: float,
    faults: list[tuple[float, str]],
    trace: NatsTrace | None,
) -> int:
    """Write the timeline of every slow or unanswered turn to ``path``; return how many."""
    slow = [
        t
        for t in turns
        if t.started is not None and (t.answered is None or t.answered - t.started > SLOW_SECONDS)
    ]
    if not slow:
        return 0
    lines = ["faults: " + ", ".join(f"{at - started:.1f}s {what}" for at, what in faults)]
    for turn in slow:
        assert turn.started is not None
        end = turn.answered if turn.answered is not None else time.monotonic()
        lines.append("")
        lines.append(
            f"{turn.session} turn {turn.index}: sent {turn.started - started:.1f}s, "
            + (
                f"answered {end - started:.1f}s (waited {end - turn.started:.1f}s)"
                if turn.answered is not None
                else "never answered"
            )
            + f", posts {turn.posts}, status {turn.status}"
        )
        if trace is None:
            continue
        suffix = f"-p{partition_of(turn.session, PARTITIONS)}"
        shown: dict[str, dict[str, Any]] = {}
        for row in trace.rows:
            if not row.consumer.endswith(suffix) or not turn.started - 1 <= row.t <= end + 1:
                continue
            state = {k: v for k, v in row.state.items() if k != "num_waiting"}
            if shown.get(row.consumer) != state:  # pull requests come and go all the time
                shown[row.consumer] = state
                lines.append(f"  {row.t - started:7.2f}s {row.consumer}: {row.state}")
    path.write_text("\n".join(lines) + "\n")
    return len(slow)
