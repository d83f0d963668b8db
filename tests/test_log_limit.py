"""RateLimitedLog: the first record of a kind in full, then a count per interval."""

from __future__ import annotations

import logging

import pytest

from agentkernel.core.log_limit import RateLimitedLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.limit"]


def test_repeats_within_the_interval_are_counted_then_summarised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="test.limit")
    clock = Clock()
    log = RateLimitedLog(logging.getLogger("test.limit"), interval=10, clock=clock)
    assert log.log(logging.WARNING, "k", "failed %s", 1) is True
    assert [log.log(logging.WARNING, "k", "failed %s", i) for i in range(500)] == [False] * 500
    clock.now += 10
    assert log.log(logging.WARNING, "k", "failed %s", "again") is True
    assert messages(caplog) == [
        "failed 1",
        "k: 500 more like it in 10.0s (not logged)",
        "failed again",
    ]


def test_keys_are_limited_independently(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.limit")
    log = RateLimitedLog(logging.getLogger("test.limit"), interval=10, clock=Clock())
    for _ in range(3):
        log.log(logging.ERROR, "a", "a failed")
        log.log(logging.ERROR, "b", "b failed")
    assert messages(caplog) == ["a failed", "b failed"]


def test_flush_reports_pending_counts_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.limit")
    log = RateLimitedLog(logging.getLogger("test.limit"), interval=10, clock=Clock())
    for _ in range(4):
        log.log(logging.WARNING, "k", "x")
    log.flush()
    log.flush()
    assert messages(caplog) == ["x", "k: 3 more like it in 0.0s (not logged)"]


def test_exc_info_is_kept_on_the_logged_record(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.limit")
    log = RateLimitedLog(logging.getLogger("test.limit"), clock=Clock())
    try:
        raise ValueError("boom")
    except ValueError:
        log.log(logging.ERROR, "k", "failed", exc_info=True)
    assert caplog.records[-1].exc_info is not None
