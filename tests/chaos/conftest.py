"""The chaos suite runs only when asked for: ``-m chaos`` or a path inside tests/chaos.

``python -m pytest`` (the README's command) leaves it out so the everyday run stays quick;
``.ci/run`` runs it as a stage of its own under a hard time bound. Each scenario prints its tally
line as it ends, and all of them are repeated in the summary.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).parent.resolve()


def _asked_for(config: pytest.Config) -> bool:
    if "chaos" in (config.option.markexpr or ""):
        return True
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


#: Scenarios that still fail on the current code, with what is known of why. CI leaves them out
#: (the rest must pass); ``CHAOS_KNOWN_GAPS=1`` runs them too, to work on them.
KNOWN_GAPS = {
    "kafka-sigterm-io": "Tansu: two members leaving a group together leave the next two without "
    "an assignment for longer than the cap (reproduced with confluent-kafka alone, docs/chaos.md)",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _asked_for(config):
        if os.environ.get("CHAOS_KNOWN_GAPS") != "1":
            gaps = [item for item in items if _scenario(item) in KNOWN_GAPS]
            if gaps:
                config.hook.pytest_deselected(items=gaps)
                items[:] = [item for item in items if item not in gaps]
        return
    chaos = [item for item in items if item.get_closest_marker("chaos")]
    if chaos:
        config.hook.pytest_deselected(items=chaos)
        items[:] = [item for item in items if not item.get_closest_marker("chaos")]


def _scenario(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    return "" if callspec is None else "-".join(str(v) for v in callspec.params.values())


#: The user property a scenario's tally line travels in (from an xdist worker too).
TALLY = "chaos tally"


@pytest.fixture
def record_tally(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> Callable[[str], None]:
    """Print a scenario's tally line as it ends, and keep it for the run's summary."""

    def record(line: str) -> None:
        request.node.user_properties.append((TALLY, line))
        with capsys.disabled():
            print(f"\n{line}")

    return record


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = [
        value
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == TALLY
    ]
    if lines:
        terminalreporter.section("chaos tallies")
        for line in lines:
            terminalreporter.write_line(line)
