"""The exception tree of agentkernel.

    AgentKernelError
     +-- AKConfigError            invalid or missing configuration (names the key)
     +-- TransportError           a queue broker failed or refused an operation
     |    +-- TransportClosedError      the consumer or transport was already closed
     |    +-- MessageRejectedError      the message breaks a broker limit (size, attributes)
     +-- StoreError               a response or session store failed
     |    +-- StoreUnavailableError     a store could not be reached; retry later
     |    |    +-- StoreFullError       the store refuses writes (Redis at maxmemory); retry later
     |    +-- StoreDataLostError        the store lost data this process relied on; not retried
     |    +-- ResponseStoreError        the response store failed
     |    +-- SessionStoreError         the session store failed
     |         +-- StaleSessionError    a turn's commit lost to a newer one (fenced)
     |         +-- SessionStateError    the state a turn left cannot be stored; not retried
     |         +-- SessionStoreUnavailableError   (also a StoreUnavailableError)
     +-- AgentNotFoundError       no agent with the requested name is registered
     +-- RetryableError           raised by an agent: run this turn again later

Exceptions of client libraries (botocore, nats, confluent_kafka, redis) never leave a backend:
they are chained onto one of these with ``raise ... from exc``.
"""

from __future__ import annotations


class AgentKernelError(Exception):
    """Root of every exception agentkernel raises on purpose."""


class AKConfigError(AgentKernelError):
    """Configuration is invalid or incomplete; the message names the offending key."""


class TransportError(AgentKernelError):
    """A queue transport could not complete an operation."""


class TransportClosedError(TransportError):
    """The consumer or transport was closed and cannot be used again."""


class MessageRejectedError(TransportError):
    """The message breaks a limit of the broker (size, number of attributes) and was not sent."""


class StoreError(AgentKernelError):
    """A response or session store operation failed."""


class StoreUnavailableError(StoreError):
    """A store could not be reached or did not answer in time; worth retrying."""


class StoreFullError(StoreUnavailableError):
    """The store is up but refuses writes (Redis at ``maxmemory`` with ``noeviction``); worth
    retrying once an operator makes room."""


class StoreDataLostError(StoreError):
    """The store no longer holds data it held before (emptied, restarted without persistence,
    or evicting keys), so a missing record cannot be told from a lost one. Not worth retrying:
    an operator restores the data, or restarts the processes to accept the loss."""


class ResponseStoreError(StoreError):
    """A response store operation failed (an unreachable one raises
    :class:`StoreUnavailableError`)."""


class SessionStoreError(StoreError):
    """The session store could not read or commit a session."""


class StaleSessionError(SessionStoreError):
    """A commit was refused: the session changed since it was read (a newer attempt won)."""


class SessionStateError(SessionStoreError):
    """The state an agent left cannot be stored: it is not JSON-serialisable, or it is larger
    than the store takes. The agent's doing, so every attempt would fail the same way: the
    turn is answered ``STATE_NOT_STORED`` at once instead of being retried."""


class AgentNotFoundError(AgentKernelError):
    """No agent with the requested name is registered in this process."""


class RetryableError(AgentKernelError):
    """Raise from an agent to have the turn delivered again (bounded by ``max_receive_count``).

    Any other exception an agent raises ends the turn with an error reply (status 500) and is
    not retried: retrying a deterministic failure only burns model tokens.
    """


class SessionStoreUnavailableError(SessionStoreError, StoreUnavailableError):
    """The session store could not be reached or did not answer in time; worth retrying."""
