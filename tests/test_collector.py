"""The garbage-collector settings a server process takes (process-wide: each case runs in a
fresh interpreter, never in the test process)."""

from __future__ import annotations

import json
import subprocess
import sys

from agentkernel.pipeline.runtime.collector import GEN0_THRESHOLD

#: What a child prints as its last line: the collector's settings at that moment.
REPORT = (
    "print(json.dumps({'threshold': gc.get_threshold(), 'frozen': gc.get_freeze_count(), "
    "'enabled': gc.isenabled(), 'before': before}))"
)


def in_child(code: str) -> dict[str, object]:
    """Run ``code`` (which ends by printing :data:`REPORT`) in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def after_tuning(prelude: str) -> dict[str, object]:
    return in_child(
        "import gc, json\n"
        f"{prelude}\n"
        "before = gc.get_threshold()\n"
        "from agentkernel.pipeline.runtime.collector import tune_for_server\n"
        "tune_for_server()\n"
        f"{REPORT}\n"
    )


def test_the_start_up_objects_are_frozen_and_young_collections_are_rarer() -> None:
    state = after_tuning("")
    before = state["before"]
    assert isinstance(before, list)
    assert state["threshold"] == [GEN0_THRESHOLD, *before[1:]]  # the older ones as they were
    assert isinstance(state["frozen"], int) and state["frozen"] > 1000


def test_a_higher_threshold_the_application_set_is_kept() -> None:
    assert after_tuning("gc.set_threshold(50000, 5, 7)")["threshold"] == [50000, 5, 7]


def test_a_disabled_collector_is_left_alone() -> None:
    state = after_tuning("gc.disable()")
    assert (state["threshold"], state["frozen"], state["enabled"]) == (state["before"], 0, False)


def test_the_runner_entry_point_tunes_its_process() -> None:
    # AgentRunner.run() is the process entry of `agentkernel runner`; serve() is replaced so the
    # child reports the collector's settings at the moment the runner would start consuming.
    state = in_child(
        "import gc, json\n"
        "before = gc.get_threshold()\n"
        "from agentkernel.pipeline.runner.agent_runner import AgentRunner\n"
        "def report(self):\n"
        f"    {REPORT}\n"
        "AgentRunner.serve = report\n"
        "AgentRunner.run()\n"
    )
    threshold = state["threshold"]
    assert isinstance(threshold, list) and threshold[0] == GEN0_THRESHOLD
    assert isinstance(state["frozen"], int) and state["frozen"] > 1000
