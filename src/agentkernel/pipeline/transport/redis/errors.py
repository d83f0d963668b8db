"""The one classification of redis-py exceptions for the Redis Streams transport.

Every client error becomes a :class:`~agentkernel.core.errors.TransportError` (through
:func:`agentkernel.core.redis_errors.redis_errors`, the mapping every Redis backend shares); a
consumer group that is gone (``NOGROUP``: Redis restarted without persistence, or the keys were
deleted) says so, since no retry brings it back::

    with stream_errors("fetch from {ak:q:input}"):
        ...
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from agentkernel.core.errors import TransportError
from agentkernel.core.redis_errors import redis_errors


@contextmanager
def stream_errors(operation: str) -> Iterator[None]:
    """Turn redis-py exceptions raised in the block into :class:`TransportError`.

    Args:
        operation: what the block does, for the message ("send to ak:q:input").
    """
    try:
        with redis_errors(operation, unavailable=TransportError, failed=TransportError):
            yield
    except TransportError as exc:
        if "NOGROUP" not in str(exc):
            raise
        raise TransportError(
            f"{exc}: the consumer group is gone (Redis restarted without persistence, or its "
            "keys were deleted); provision the queue again"
        ) from exc.__cause__
