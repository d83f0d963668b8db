"""How a :class:`~agentkernel.pipeline.consumer.loop.ConsumerLoop` fetches, and its timings."""

from __future__ import annotations

from dataclasses import dataclass

POLL_ERROR_BACKOFF_SECONDS = 5.0
#: First wait before creating a consumer again after creating it failed; doubles, capped.
CONSUMER_RETRY_SECONDS = 1.0
MAX_CONSUMER_RETRY_SECONDS = 30.0
DRAIN_TIMEOUT_SECONDS = 20.0
#: How often a drain asks a consumer that hands it messages for those freed since.
LATE_POLL_SECONDS = 0.1
#: How often fetching on a home loop looks again whether a suspect that runs alone has finished.
FETCH_CLOSED_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class LoopSettings:
    """How a :class:`ConsumerLoop` fetches.

    Args:
        num_consumers: consumer threads.
        batch_size: messages asked for per fetch.
        max_in_flight: messages handled at once across all threads when ``process`` is async.
        wait_seconds: longest wait per fetch; sliced to the consumer's
            ``fetch_wait_slice_seconds`` (about a second by default) so shutdown is noticed.
        drain_timeout: seconds a stopping thread waits for its messages in flight; what is
            still unfinished then is logged and handed back (nacked).
        stall_warning: warn when the handling's event loop is blocked longer than this many
            seconds (``None``: off).
    """

    num_consumers: int = 1
    batch_size: int = 1
    max_in_flight: int = 256
    wait_seconds: float = 20.0
    drain_timeout: float = DRAIN_TIMEOUT_SECONDS
    stall_warning: float | None = None

    def __post_init__(self) -> None:
        if self.num_consumers < 1 or self.batch_size < 1 or self.max_in_flight < 1:
            raise ValueError("num_consumers, batch_size and max_in_flight must be at least 1")
        if self.drain_timeout < 0:
            raise ValueError("drain_timeout must not be negative")
