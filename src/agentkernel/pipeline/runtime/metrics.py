"""A small Prometheus text-format registry (counters, gauges, histograms with labels).

The process-wide registry is :data:`METRICS`; ``GET /metrics`` renders it. :meth:`Metrics.reset`
clears it for tests.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from collections import defaultdict
from collections.abc import Callable

Labels = tuple[tuple[str, str], ...]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


def _labels(labels: dict[str, str]) -> Labels:
    return tuple(labels.items()) if len(labels) < 2 else tuple(sorted(labels.items()))


def _fmt(labels: Labels, extra: tuple[tuple[str, str], ...] = ()) -> str:
    pairs = labels + extra
    if not pairs:
        return ""
    escaped = (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for _, v in pairs)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(pairs, escaped, strict=True)) + "}"


class Metrics:
    """Named metrics with help text; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._help: dict[str, tuple[str, str]] = {}
        self._values: dict[str, dict[Labels, float]] = defaultdict(dict)
        self._hist: dict[str, dict[Labels, list[float]]] = defaultdict(dict)
        self._collectors: list[Callable[[], None]] = []

    def describe(self, name: str, kind: str, text: str) -> None:
        with self._lock:
            self._help.setdefault(name, (kind, text))

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = _labels(labels)
        with self._lock:
            series = self._values[name]
            series[key] = series.get(key, 0.0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._values[name][_labels(labels)] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        key = _labels(labels)
        with self._lock:
            counts = self._hist[name].setdefault(key, [0.0] * (len(LATENCY_BUCKETS) + 2))
            counts[bisect.bisect_left(LATENCY_BUCKETS, value)] += 1
            counts[-1] += value

    def add_collector(self, collect: Callable[[], None]) -> None:
        """Call ``collect`` before every render (to sample gauges such as queue depth)."""
        with self._lock:
            self._collectors.append(collect)

    def render(self) -> str:
        """The registry in Prometheus text exposition format 0.0.4."""
        for collect in list(self._collectors):
            with contextlib.suppress(Exception):
                collect()
        lines: list[str] = []
        with self._lock:
            for name, (kind, text) in sorted(self._help.items()):
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
                if kind == "histogram":
                    lines += self._render_histogram(name)
                else:
                    for key, value in sorted(self._values[name].items()):
                        lines.append(f"{name}{_fmt(key)} {value:g}")
        return "\n".join(lines) + "\n"

    def _render_histogram(self, name: str) -> list[str]:
        lines = []
        for key, counts in sorted(self._hist[name].items()):
            running = 0.0
            for bound, count in zip((*LATENCY_BUCKETS, "+Inf"), counts[:-1], strict=True):
                running += count
                lines.append(f"{name}_bucket{_fmt(key, (('le', str(bound)),))} {running:g}")
            lines.append(f"{name}_sum{_fmt(key)} {counts[-1]:g}")
            lines.append(f"{name}_count{_fmt(key)} {running:g}")
        return lines

    def reset(self) -> None:
        with self._lock:
            self._values.clear()
            self._hist.clear()
            self._collectors.clear()


METRICS = Metrics()
METRICS.describe("agentkernel_turns_total", "counter", "Agent turns finished, by agent and status.")
METRICS.describe("agentkernel_turns_in_flight", "gauge", "Agent turns running in this process.")
METRICS.describe("agentkernel_turn_duration_seconds", "histogram", "Agent turn run time.")
METRICS.describe(
    "agentkernel_turns_replayed_total",
    "counter",
    "Deliveries of turns already committed: answered from the session record, not run again.",
)
METRICS.describe(
    "agentkernel_redeliveries_total", "counter", "Deliveries after the first, by queue."
)
METRICS.describe(
    "agentkernel_permanent_failures_total", "counter", "Messages that exhausted their deliveries."
)
METRICS.describe(
    "agentkernel_undecodable_messages_total",
    "counter",
    "Messages the transport could not decode, dead-lettered unprocessed, by queue.",
)
METRICS.describe("agentkernel_queue_depth", "gauge", "Messages waiting on a queue (when known).")
METRICS.describe("agentkernel_http_requests_total", "counter", "HTTP chat requests by status.")
METRICS.describe(
    "agentkernel_webhook_deliveries_total",
    "counter",
    "Completion webhooks by outcome: delivered, retried (each retry scheduled), failed (refused, "
    "a final answer, or out of time), dropped (backlog full, or the process stopped).",
)
METRICS.describe(
    "agentkernel_webhook_delivery_seconds",
    "histogram",
    "Seconds from a reply's arrival to its webhook's last attempt, by outcome.",
)
METRICS.describe(
    "agentkernel_webhooks_pending", "gauge", "Webhooks held: being sent or waiting to be retried."
)
