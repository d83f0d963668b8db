"""The one classification of nats-py exceptions, for every NATS call the transport makes.

The same shape as :mod:`agentkernel.core.redis_errors`, :mod:`agentkernel.core.botocore_errors`
and :mod:`agentkernel.pipeline.transport.kafka.errors`: a context manager that turns the client
library's errors raised in its block into the project's tree. Every client error (the server's
answers, timeouts, a connection that is gone) becomes a
:class:`~agentkernel.core.errors.TransportError`, its message redacted of URL credentials::

    with nats_errors("publish to AK_INPUT"):
        await js.publish(...)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError

from agentkernel.core.errors import TransportError
from agentkernel.core.redact import redact_url

#: What nats-py raises: its own errors, timeouts, and socket errors of a lost connection.
CLIENT_ERRORS = (NatsError, asyncio.TimeoutError, TimeoutError, OSError)


@contextmanager
def nats_errors(operation: str, *, lookup: bool = False) -> Iterator[None]:
    """Turn nats-py exceptions raised in the block into :class:`TransportError`.

    Args:
        operation: what the block does, for the message ("call", "connect to <url>").
        lookup: let ``NotFoundError`` through, for provisioning, which creates what is missing;
            anywhere else a missing stream or consumer is a :class:`TransportError`.
    """
    try:
        yield
    except CLIENT_ERRORS as exc:
        if lookup and isinstance(exc, NotFoundError):
            raise
        raise TransportError(f"NATS {operation} failed: {redact_url(repr(exc))}") from exc
