"""The chaos suite: every topology under its scenarios, real servers, default lease settings.

Run one scenario:  python -m pytest "tests/chaos/test_chaos.py::test_chaos[nats-kill9]"
Run all of them:   python -m pytest -m chaos tests/chaos     (see docs/chaos.md)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos import budget
from tests.chaos.scenarios import POISON_CAP, TOPOLOGIES, cap_of, run_scenario
from tests.chaos.workload import SYNC_TIMEOUT

MARKS = {
    "embedded": [],
    "nats": [pytest.mark.nats],
    "sqs": [pytest.mark.aws],
    "kafka": [pytest.mark.kafka],
    "redis": [],
    "postgres": [pytest.mark.postgres],
}
CASES = [
    pytest.param(
        topology,
        scenario,
        id=f"{topology}-{scenario}",
        marks=[*MARKS[topology], (budget.waits if scenario == "poison" else budget.load)(topology)],
    )
    for topology, scenarios in TOPOLOGIES.items()
    for scenario in scenarios
]

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.redis]


@pytest.mark.timeout(POISON_CAP + SYNC_TIMEOUT + 120)
@pytest.mark.parametrize(("topology", "scenario"), CASES)
def test_chaos(
    topology: str,
    scenario: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    record_tally: Callable[[str], None],
) -> None:
    moto = request.getfixturevalue("moto_server").url if topology == "sqs" else None
    kafka = request.getfixturevalue("tansu_broker").bootstrap if topology == "kafka" else None
    cap = budget.cap(request.config, cap_of(scenario))
    workdir = Path(os.environ.get("CHAOS_WORKDIR", tmp_path)) / f"{topology}-{scenario}"
    shutil.rmtree(workdir, ignore_errors=True)
    tally = run_scenario(topology, scenario, workdir, cap, moto_url=moto, kafka_bootstrap=kafka)
    record_tally(tally.line())
    problems = tally.violations()
    evidence = [f"logs: {workdir / 'logs'}", f"slow turns: {workdir / 'timelines.txt'}"]
    assert not problems, "\n".join([tally.line(), *problems, *evidence])
