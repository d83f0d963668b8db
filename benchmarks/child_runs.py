"""Run a benchmark script again in a child process on another checkout's code.

A comparison of two codes runs each in its own process, alternating, with ``PYTHONPATH`` naming
the ``src`` folder of the code to import (``None``: the installed one); the child prints its
result as JSON on its last line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def child_result(script: str, src: str | None, *args: str) -> Any:
    """What ``script --child *args`` printed last, as JSON, run on the code in ``src``."""
    env = dict(os.environ) | ({"PYTHONPATH": src} if src else {})
    command = [sys.executable, script, "--child", *args]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])
