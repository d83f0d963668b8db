"""docs/serverless.md's local driver runs the five handlers end to end against moto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import servers

pytestmark = pytest.mark.aws

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "examples" / "local" / "lambda_driver.py"


def test_the_local_driver_drives_all_five_handlers(aws: str) -> None:
    done = subprocess.run(
        [sys.executable, str(DRIVER)],
        env=servers.aws_env(aws) | {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    steps = [line.split(":", 1)[0] for line in lines]
    for handler in ("agent runner", "stream agent runner", "response handler", "$connect"):
        assert handler in steps, lines
    assert lines[-1] == "all five handlers answered"
    assert '"statusCode": 401' in next(line for line in lines if "without a token" in line)


def test_the_documented_driver_is_this_file() -> None:
    page = (ROOT / "docs" / "serverless.md").read_text()
    assert "python examples/local/lambda_driver.py" in page
