"""Docker HEALTHCHECK of the agentkernel image: exit 0 when healthy, 1 when not.

IO process (``agentkernel io``/``serve``, ``app_rest_service.py``): ``GET /health`` on
``api.port``, read through the same configuration the process uses (``config.yaml`` or
``AK_API__PORT``). Agent Runner (``agentkernel runner``, ``app_agent_runner.py``): ``GET /health``
on ``execution.runner.health_port`` (the image sets 8001); with the port unset it serves no HTTP,
and a runner whose consumer thread crashes drains and exits 1, so while PID 1 is a runner the
container is healthy. The ECS task definitions run this file; Kubernetes probes declare their own
HTTP checks (see deploy/).
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

RUNNER_ENTRY_FILE = "app_agent_runner.py"
TIMEOUT_SECONDS = 3.0


def pid1_argv() -> list[str]:
    """The command line of the container's main process."""
    raw = Path("/proc/1/cmdline").read_bytes()
    return [Path(part).name for part in raw.decode(errors="replace").split("\0") if part]


def is_runner(argv: list[str]) -> bool:
    """Whether ``argv`` starts an Agent Runner (``agentkernel runner ...``, ``python
    [-m agentkernel runner | app_agent_runner.py]``) rather than a process serving HTTP."""
    args = list(argv)
    if args and args[0].startswith("python"):
        args = [a for a in args[1:] if a == "-m" or not a.startswith("-")]
        if args[:1] == ["-m"]:
            args = args[1:]
    if not args:
        return False
    if args[0] == "agentkernel":
        return args[1:2] == ["runner"]
    return args[0] == RUNNER_ENTRY_FILE


def http_health(port: int) -> bool:
    url = f"http://127.0.0.1:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as reply:
            return bool(reply.status == 200)
    except OSError as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return False


def main() -> int:
    from agentkernel.core.config.root import AKConfig

    config = AKConfig.load()
    if is_runner(pid1_argv()):
        port = config.execution.runner.health_port
        return 0 if port is None or http_health(port) else 1
    return 0 if http_health(config.api.port) else 1


if __name__ == "__main__":
    sys.exit(main())
