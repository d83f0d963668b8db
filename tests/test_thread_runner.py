"""ThreadRunner exit policy, observed from real subprocesses (no patched os._exit)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from agentkernel.pipeline.runtime.thread_runner import ThreadRunner, close_in_order

PRELUDE = textwrap.dedent(
    """
    import sys, time, threading
    from agentkernel.pipeline.runtime.thread_runner import ThreadRunner

    def say(text):
        print(text, flush=True)

    def sibling():
        say("sibling-start")
        while not ThreadRunner.shutdown_event.is_set():
            time.sleep(0.05)
        time.sleep(0.5)          # finishing the message in hand
        say("sibling-drained")
    """
)


def run_script(body: str, *, signal_after: float | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,  # unbuffered: readline must not swallow lines that communicate() then misses
    )
    if signal_after is not None:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(signal_after)
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())


def test_graceful_crash_drains_siblings_then_exits_1() -> None:
    result = run_script(
        """
        def crash():
            time.sleep(0.2)
            raise RuntimeError("consumer died")
        T = ThreadRunner.Task
        ThreadRunner.run([
            T(crash, "crasher", stop_all_on_failure=True, graceful=True),
            T(sibling, "sibling", stop_all_on_failure=True, graceful=True),
        ])
        say("not-reached")
        """
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout.split() == ["sibling-start", "sibling-drained"]
    assert "consumer died" in result.stderr


def test_non_graceful_crash_exits_at_once() -> None:
    result = run_script(
        """
        def crash():
            time.sleep(0.2)
            raise RuntimeError("fatal")
        T = ThreadRunner.Task
        ThreadRunner.run([
            T(crash, "crasher", stop_all_on_failure=True),
            T(sibling, "sibling", stop_all_on_failure=True, graceful=True),
        ])
        """
    )
    assert result.returncode == 1
    assert result.stdout.split() == ["sibling-start"]


def test_sigterm_drains_and_exits_0() -> None:
    result = run_script(
        """
        ThreadRunner.install_signal_handlers()
        def server():
            time.sleep(3600)     # like the REST thread: never checks the event
        T = ThreadRunner.Task
        say("ready")
        ThreadRunner.run([
            T(sibling, "sibling", stop_all_on_failure=True, graceful=True),
            T(server, "rest-api", awaited_on_shutdown=False),
        ])
        """,
        signal_after=0.3,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["sibling-start", "sibling-drained"]  # "ready" was read


def test_a_stuck_task_cannot_hold_the_shutdown_past_its_timeout() -> None:
    started = time.monotonic()
    result = run_script(
        """
        import logging
        logging.basicConfig(level=logging.INFO)
        ThreadRunner.install_signal_handlers()
        def stuck():
            time.sleep(3600)     # a handler that never returns
        T = ThreadRunner.Task
        say("ready")
        ThreadRunner.run(
            [
                T(sibling, "sibling", stop_all_on_failure=True, graceful=True),
                T(stuck, "stuck-consumer", stop_all_on_failure=True, graceful=True),
            ],
            shutdown_timeout=1.0,
        )
        """,
        signal_after=0.3,
    )
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 10  # without the timeout: communicate() times out
    assert "still running: stuck-consumer" in result.stderr
    assert result.stdout.split() == ["sibling-start", "sibling-drained"]


def test_close_in_order_runs_every_closer_even_after_a_failure() -> None:
    closed: list[str] = []

    def broken() -> None:
        raise RuntimeError("socket already gone")

    close_in_order([lambda: closed.append("transport"), broken, lambda: closed.append("store")])
    assert closed == ["transport", "store"]


def test_task_failure_that_does_not_stop_anything_is_only_logged() -> None:
    def fail() -> None:
        raise RuntimeError("ignored")

    results = ThreadRunner.run(
        [
            ThreadRunner.Task(fail, "ignored", stop_task_on_failure=False),
            ThreadRunner.Task(lambda: 42, "answer"),
        ],
        exit_on_shutdown=False,
    )
    assert results == {"ignored": None, "answer": 42}
    assert not ThreadRunner.shutdown_event.is_set()


def test_task_flags_are_validated() -> None:
    with pytest.raises(ValueError):
        ThreadRunner.Task(print, "t", graceful=True)
    with pytest.raises(ValueError):
        ThreadRunner.Task(print, "t", stop_task_on_failure=False, stop_all_on_failure=True)


def test_signal_handlers_need_the_main_thread() -> None:
    import threading

    outcome: list[bool] = []
    thread = threading.Thread(target=lambda: outcome.append(ThreadRunner.install_signal_handlers()))
    thread.start()
    thread.join(5)
    assert outcome == [False]
