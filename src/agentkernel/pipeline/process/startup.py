"""Start-up checks: a process that cannot work refuses to start, instead of answering 503.

Before a process serves anything it asks, once, each queue and store it uses, with the calls
its deployment role may make (an Agent Runner may only send to OUTPUT, so it checks INPUT). A
queue, stream, topic or table that does not exist is a configuration error
(:class:`~agentkernel.core.errors.AKConfigError` naming it); a broker or store that does not
answer raises its own error. The ``agentkernel`` command prints either as one line and exits 2;
the container entry points (``ECSIOHandler.run()``, ``ECSAgentRunner.run()``) do the same through
:func:`one_line_exit`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from agentkernel.core.errors import AKConfigError, StoreError, TransportError
from agentkernel.pipeline.runtime.readiness import CheckedStore
from agentkernel.pipeline.transport.blocking import AnyTransport
from agentkernel.pipeline.wire.envelope import QueueName

__all__ = ["check_backends", "one_line_exit"]

#: The configuration block of each store, by its name in ``/ready``.
_KEYS = {"response_store": "execution.response_store", "session_store": "session"}


def check_backends(
    transport: AnyTransport,
    queues: tuple[QueueName, ...],
    stores: Mapping[str, CheckedStore],
) -> None:
    """Check ``queues`` on ``transport``, then ping every store.

    Raises:
        AKConfigError: a queue or a table does not exist.
        TransportError: the broker cannot be reached.
        StoreError: a store cannot be reached or refuses work.
    """
    transport.check_queues(queues)
    for name, store in stores.items():
        try:
            store.ping()
        except StoreError as exc:  # the same error, saying which store it is about
            raise type(exc)(f"{_KEYS.get(name, name)}: {exc}") from exc


@contextmanager
def one_line_exit() -> Iterator[None]:
    """Around a container entry's start: a configuration error, or a broker or store that
    cannot be reached, is one line on stderr and exit status 2 (as the ``agentkernel`` command
    does), not a traceback per thread.

    Raises:
        SystemExit: status 2, after printing the error.
    """
    try:
        yield
    except (AKConfigError, TransportError, StoreError) as exc:
        print(f"agentkernel: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
