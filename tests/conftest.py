"""Shared fixtures: every test starts with clean process-wide state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentkernel.core.config import AKConfig
from agentkernel.pipeline.thread_runner import ThreadRunner
from agentkernel.pipeline.transport.in_memory import InMemoryTransport


@pytest.fixture(autouse=True)
def _clean_process_state(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    # A config.yaml in the working directory or AK_ variables of the caller must not leak in.
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    ThreadRunner.reset()
    InMemoryTransport.reset()
    AKConfig.reset()
    yield
    ThreadRunner.reset()
    InMemoryTransport.reset()
    AKConfig.reset()
