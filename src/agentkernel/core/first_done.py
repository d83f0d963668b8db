"""Wait for the first of a few futures: ``asyncio.wait(..., return_when=FIRST_COMPLETED)`` for
the hot paths that wait once per turn (a turn's deadline or stop, a sync caller's reply).

``asyncio.wait`` copies its futures into sets, checks each for a coroutine, wraps each in
``ensure_future`` and builds the done and pending sets it returns; :func:`first_done` only
registers one wake-up on each future (and a timer), which is all these callers need.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

__all__ = ["first_done"]


async def first_done(futures: Sequence[asyncio.Future[Any]], timeout: float | None = None) -> None:
    """Return once one of ``futures`` is done, or after ``timeout`` seconds (``None``: no limit).

    The futures are left as they are (none is cancelled); the caller looks at which is done.
    """
    if any(future.done() for future in futures):
        return
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not woken.done():
            woken.set_result(None)

    for future in futures:
        future.add_done_callback(wake)
    timer = None if timeout is None else loop.call_later(timeout, wake)
    try:
        await woken
    finally:
        if timer is not None:
            timer.cancel()
        for future in futures:
            future.remove_done_callback(wake)
