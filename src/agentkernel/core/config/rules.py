"""Rules that tie configuration keys of different blocks together.

A single field's bounds live on the field; what is checked here spans blocks, such as a reply
that must stay readable for as long as the broker drops a re-sent copy of its turn.
"""

from __future__ import annotations

from agentkernel.core.config.queues import QueuesConfig
from agentkernel.core.config.stores import ResponseStoreConfig
from agentkernel.core.errors import AKConfigError

#: SQS FIFO queues drop a repeated MessageDeduplicationId for a fixed five minutes.
SQS_DEDUP_WINDOW_SECONDS = 300.0
#: The in-memory transport's window when its block is absent (its field default).
IN_MEMORY_DEDUP_WINDOW_SECONDS = 300.0


def dedup_window(queues: QueuesConfig) -> tuple[str, float] | None:
    """The key naming the transport's dedup window and its seconds; ``None`` if unknown."""
    if queues.type == "in_memory":
        block = queues.in_memory
        seconds = block.dedup_window if block else IN_MEMORY_DEDUP_WINDOW_SECONDS
        return "execution.queues.in_memory.dedup_window", seconds
    if queues.type == "sqs":
        return "the SQS FIFO deduplication window", SQS_DEDUP_WINDOW_SECONDS
    if queues.type == "nats" and queues.nats is not None:
        return "execution.queues.nats.duplicate_window", queues.nats.duplicate_window
    if queues.type == "kafka" and queues.kafka is not None:
        return "execution.queues.kafka.dedup_window", queues.kafka.dedup_window
    return None  # a transport of the user's: its window is its own business


def check_reply_ttl(queues: QueuesConfig, store: ResponseStoreConfig) -> None:
    """Refuse a reply TTL shorter than the broker's dedup window.

    A client retrying with the same ``Idempotency-Key`` re-sends the turn with the same dedup
    id. Inside the window the broker drops that copy, so the only answer left is the stored
    reply (or ticket): if it expired first, the retry waits for a reply that never comes.

    Raises:
        AKConfigError: ``execution.response_store.ttl`` is below the window.
    """
    window = dedup_window(queues)
    if window is None or store.ttl >= window[1]:
        return
    name, seconds = window
    raise AKConfigError(
        f"execution.response_store.ttl is {store.ttl:g}s, shorter than {name} ({seconds:g}s): "
        "a retried turn would be dropped as a duplicate after its reply expired and never be "
        f"answered; set execution.response_store.ttl to at least {seconds:g}"
    )
