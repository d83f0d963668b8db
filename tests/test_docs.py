"""Documentation that is generated or quoted stays true."""

from __future__ import annotations

from pathlib import Path

from agentkernel.core.config.reference import render

ROOT = Path(__file__).resolve().parents[1]


def test_configuration_reference_is_current() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == render(), (
        "docs/configuration.md is stale: python -m agentkernel.core.config.reference "
        "> docs/configuration.md"
    )


def test_readme_first_screen_has_the_run_and_test_commands() -> None:
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:20])
    assert "agentkernel serve examples/echo.py" in first_screen
    assert "python -m pytest" in first_screen
