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
#: Two pytest-xdist workers run the suite (``-n 2 --dist loadgroup``): the scenarios that mostly
#: wait out leases and crashes (poison, replay) on one, those that load the machine on the
#: other, so that no two load-heavy scenarios share the two cores. Without ``-n`` the marks do
#: nothing. Each worker keeps its own budget.
WAITS = pytest.mark.xdist_group("chaos-waits")
LOAD = pytest.mark.xdist_group("chaos-load")


def cap(config: pytest.Config, wanted: float) -> float:
    """A scenario's cap: ``wanted``, or less when the suite's budget is running out."""
    started = config.stash.setdefault(STARTED, time.monotonic())
    left = BUDGET - (time.monotonic() - started) - OVERHEAD
    if left < SHORTEST:
        pytest.fail(f"the chaos suite's budget of {BUDGET:g}s is spent", pytrace=False)
    return min(wanted, left)
