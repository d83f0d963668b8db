"""What a failed model call means for the turn: run it again later, or answer with an error.

The framework adapters (:mod:`agentkernel.openai`, :mod:`agentkernel.langgraph`) pass whatever
their framework raised through :func:`model_failure`:

- a rate limit (429), a timeout, a lost connection, an overloaded or failing provider (408, 409,
  5xx) become :class:`~agentkernel.RetryableError`: the turn is delivered again, up to
  ``max_receive_count`` times, then the caller gets ``TURN_FAILED``;
- a refused request (other 4xx) or a response that cannot be parsed become :class:`ModelError`:
  the caller gets ``500 AGENT_ERROR`` with its message at once, as retrying cannot help.

Provider SDKs are not imported here: their errors are recognised by an HTTP ``status_code``
attribute and by class names (those of the OpenAI SDK, which LangChain's OpenAI models and
other providers' SDKs share, and of httpx).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import NoReturn, TypeVar

from agentkernel.core.errors import AgentKernelError, RetryableError

T = TypeVar("T")

_TRANSIENT = frozenset(
    {
        "APITimeoutError",
        "APIConnectionError",
        "ModelTimeoutError",
        "TimeoutException",
        "NetworkError",
        "RemoteProtocolError",
    }
)
_MALFORMED = frozenset({"APIResponseValidationError", "ModelBehaviorError"})


class ModelError(AgentKernelError):
    """The model provider refused the request or answered something unusable (not retried)."""


def model_failure(exc: BaseException) -> Exception | None:
    """The exception a turn should raise for ``exc``, or ``None`` when it is not a model error.

    The cause chain is searched, since frameworks wrap provider errors in their own.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        mapped = _classify(current)
        if mapped is not None:
            return mapped
        current = current.__cause__ or current.__context__
    return None


def raise_model_failure(what: str, timeout: float, exc: Exception) -> NoReturn:
    """Raise what ``exc`` means for the turn of ``what`` (an agent or graph, bounded by
    ``timeout`` seconds): retry a timeout or a transient failure, refuse the rest."""
    if isinstance(exc, TimeoutError):
        raise RetryableError(f"{what} did not finish within {timeout} seconds") from exc
    mapped = model_failure(exc)
    if mapped is None:
        raise exc
    raise mapped from exc


async def within(items: AsyncIterator[T], seconds: float) -> AsyncIterator[T]:
    """The items of a stream, raising ``TimeoutError`` if they are not all there in time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        try:
            yield await asyncio.wait_for(anext(items), deadline - loop.time())
        except StopAsyncIteration:
            return


def _classify(exc: BaseException) -> Exception | None:
    names = {cls.__name__ for cls in type(exc).__mro__}
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        if status in (408, 409, 429) or status >= 500:
            return RetryableError(f"the model provider answered HTTP {status}: {_message(exc)}")
        return ModelError(
            f"the model provider refused the request (HTTP {status}): {_message(exc)}"
        )
    if isinstance(exc, TimeoutError) or names & _TRANSIENT:
        return RetryableError(f"the model call failed: {type(exc).__name__}: {_message(exc)}")
    if isinstance(exc, json.JSONDecodeError) or names & _MALFORMED:
        return ModelError(f"the model's response is malformed: {type(exc).__name__}: {exc}")
    return None


def _message(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    return str(message) if message else str(exc) or type(exc).__name__
