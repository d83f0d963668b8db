"""The playground against a real ``agentkernel serve`` process, in Debian's headless Chromium.

Chromium comes from the distribution (``apt-get install chromium chromium-driver``; ``.ci/run``
installs it), driven by Playwright with ``executable_path``: Playwright's own browser download is
never used, and this machine has no network for it. Without Chromium the browser tests skip when
run by hand and fail under ``CI=true`` (:func:`tests.servers.unavailable`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import free_port, unavailable

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("AGENTKERNEL_CHROMIUM", "/usr/bin/chromium")
# No network on the test machines: nothing in the background may try to reach it.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


class ServeProcess:
    """``agentkernel serve`` of examples/echo.py's agents (and ``fails``, ``once``: see
    agents.py) on one port, stopped and started again at will; ``args`` are more options of
    ``serve``."""

    def __init__(self, tmp: Path, config: str = "", args: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp / "config.yaml"
        self.config.write_text(config or "{}\n")
        self.logs = tmp / "serve.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.args = args
        self.start()

    def start(self) -> None:
        agents = str(Path(__file__).with_name("agents.py"))
        command = [sys.executable, "-m", "agentkernel", "serve", agents]
        command += ["--port", str(self.port), "--config", str(self.config), "--access-log"]
        command += self.args
        with self.logs.open("ab") as log:
            self.proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.logs.read_text()
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError("agentkernel serve did not become healthy")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        self.proc = None


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    server = ServeProcess(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium (a fresh profile of its own, removed when it closes)."""
    if not os.access(CHROMIUM, os.X_OK):
        unavailable(f"{CHROMIUM} is missing: apt-get install -y chromium chromium-driver")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed (pip install -e '.[test]')")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A page 1280x720; a script error or a Content-Security-Policy violation fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))

    def on_console(message: Any) -> None:
        if "Content Security Policy" in message.text:
            errors.append(message.text)

    tab.on("console", on_console)
    yield tab
    context.close()
    assert not errors, errors
