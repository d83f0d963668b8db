"""The suite's time budget: all scenarios together stay under ``CHAOS_BUDGET`` seconds.

A scenario that keeps failing runs until its cap; with many such scenarios the suite would
overrun the CI stage's hard bound and lose every tally line. So each scenario's cap shrinks to
what is left of the budget, and a scenario that starts with too little left fails at once,
saying so, instead of being killed without a word.
"""

from __future__ import annotations

import os
import time

import pytest

BUDGET = float(os.environ.get("CHAOS_BUDGET", "1500"))
#: Start-up, warm-up and teardown of one scenario, outside its cap.
OVERHEAD = 20.0
#: A scenario needs at least this much workload time to mean anything.
SHORTEST = 15.0
STARTED = pytest.StashKey[float]()
#: Four pytest-xdist workers run the suite (``-n 4 --dist loadgroup``), one lane each: two
#: lanes of the scenarios that mostly wait out leases and crashes (poison, replay, store loss,
#: foreign messages) and two of those that load the machine, each pair split by topology so that
#: the lanes take about as long (measured 2026-12-07, two cores: waits 281 and 264 s, loads 271
#: and 253 s). At most two load-heavy scenarios share the two cores at a time. Without ``-n``
#: the marks do nothing. Each worker keeps its own budget.
_WAITS_FIRST = {"sqs", "kafka", "postgres"}
_LOAD_FIRST = {"embedded", "nats", "sqs"}


def waits(topology: str = "") -> pytest.MarkDecorator:
    """The lane of a scenario that mostly waits, on ``topology`` ("" for the second lane)."""
    return pytest.mark.xdist_group("chaos-waits-" + ("a" if topology in _WAITS_FIRST else "b"))


def load(topology: str = "") -> pytest.MarkDecorator:
    """The lane of a scenario that loads the machine, on ``topology`` ("" for the second lane)."""
    return pytest.mark.xdist_group("chaos-load-" + ("a" if topology in _LOAD_FIRST else "b"))


def cap(config: pytest.Config, wanted: float) -> float:
    """A scenario's cap: ``wanted``, or less when the suite's budget is running out."""
    started = config.stash.setdefault(STARTED, time.monotonic())
    left = BUDGET - (time.monotonic() - started) - OVERHEAD
    if left < SHORTEST:
        pytest.fail(f"the chaos suite's budget of {BUDGET:g}s is spent", pytrace=False)
    return min(wanted, left)
