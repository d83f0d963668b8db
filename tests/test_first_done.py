"""first_done: the first of a few futures, or a timeout, leaving no callback behind."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentkernel.core.first_done import first_done


def test_it_returns_when_the_first_future_is_done_and_leaves_the_others() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        slow, fast = loop.create_future(), loop.create_future()
        loop.call_later(0.01, fast.set_result, "x")
        started = time.monotonic()
        await first_done((slow, fast), timeout=5)
        assert time.monotonic() - started < 1
        assert fast.done() and not slow.done()
        slow.set_result(None)  # no wake-up left registered on it to fire
        await asyncio.sleep(0)

    asyncio.run(run())


def test_it_returns_after_the_timeout_with_nothing_done() -> None:
    async def run() -> None:
        future = asyncio.get_running_loop().create_future()
        started = time.monotonic()
        await first_done((future,), timeout=0.05)
        assert 0.04 < time.monotonic() - started < 1 and not future.done()

    asyncio.run(run())


def test_a_future_already_done_returns_at_once() -> None:
    async def run() -> None:
        future = asyncio.get_running_loop().create_future()
        future.set_result(1)
        await asyncio.wait_for(first_done((future,), timeout=None), 1)

    asyncio.run(run())


def test_a_cancelled_waiter_leaves_no_callback_on_the_futures() -> None:
    async def run() -> None:
        future = asyncio.get_running_loop().create_future()
        waiter = asyncio.ensure_future(first_done((future,), timeout=None))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not future._callbacks  # type: ignore[attr-defined]

    asyncio.run(run())
