"""The event loop of a Lambda container, kept across its warm invocations.

Every Lambda handler of this package (the request handler, the agent runners, the response
handler) runs its async work on this one loop. A fresh loop per invocation (``asyncio.run``)
breaks what clients keep between invocations: the OpenAI Agents SDK, for one, keeps a
process-wide HTTP client whose pooled connections belong to the loop that opened them, so the
next invocation's turn failed with ``Event loop is closed``.

The loop runs on its own daemon thread (the pipeline's
:class:`~agentkernel.pipeline.runtime.event_loop.LoopThread`), started by the first
invocation; the invocation's thread waits for its work there. Lambda
freezes the thread between invocations with the rest of the process. Handlers called from
several threads at once (tests that drive a whole deployment in one process) share it safely.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from agentkernel.pipeline.runtime.event_loop import LoopThread

T = TypeVar("T")

_loop = LoopThread("lambda-container")


def run_in_container(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` on the container's event loop and return its result (or raise its error)."""
    return _loop.run(work)


def reset() -> None:
    """Stop the container's loop; the next invocation starts a new one (tests only: what a
    client kept from the old loop cannot be used on the new one)."""
    _loop.stop()
