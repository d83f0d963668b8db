"""The one classification of confluent-kafka exceptions, for every Kafka call the transport makes.

The same shape as :mod:`agentkernel.core.redis_errors` and :mod:`agentkernel.core.botocore_errors`:
a context manager that turns the client library's errors raised in its block into the project's
tree. A setting librdkafka refuses (an unknown property, a value of the wrong kind) is a mistake
in the configuration, named with its config block; anything else the broker or the client
reports becomes ``failed`` (a :class:`~agentkernel.core.errors.TransportError` unless the caller
says otherwise)::

    with kafka_errors("producer", key="execution.queues.kafka.client_config"):
        producer = Producer(conf)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaError, KafkaException

from agentkernel.core.errors import AgentKernelError, AKConfigError, TransportError

#: librdkafka's code for a configuration property it does not know or a value it refuses.
_INVALID_ARG = KafkaError._INVALID_ARG


def error_code(exc: BaseException | None) -> int | None:
    """The librdkafka error code of a :class:`KafkaException` (``None`` for anything else)."""
    if not isinstance(exc, KafkaException) or not exc.args:
        return None
    error = exc.args[0]
    return int(error.code()) if isinstance(error, KafkaError) else None


@contextmanager
def kafka_errors(
    operation: str,
    *,
    key: str | None = None,
    failed: type[AgentKernelError] = TransportError,
) -> Iterator[None]:
    """Turn confluent-kafka exceptions raised in the block into the project's errors.

    Args:
        operation: what the block does, for the message ("produce to agent-input").
        key: for a block that builds a client, the config block its settings came from.
        failed: raised for any other error, and for a call that timed out.

    Raises:
        AKConfigError: with ``key``, librdkafka refused a setting (``_INVALID_ARG``, or the
            ``ValueError`` its constructors raise for a missing required one).
    """
    try:
        yield
    except KafkaException as exc:
        if key is not None and error_code(exc) == _INVALID_ARG:
            raise AKConfigError(f"{key}: {_reason(exc)}") from exc
        raise failed(f"Kafka {operation} failed: {_reason(exc)}") from exc
    except ValueError as exc:  # a client constructor's own check ("group.id must be set")
        if key is None:
            raise
        raise AKConfigError(f"{key}: {exc}") from exc
    except TimeoutError as exc:  # an admin future that did not resolve in time
        raise failed(f"Kafka {operation} timed out") from exc


def _reason(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)
