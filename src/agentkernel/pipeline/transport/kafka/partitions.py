"""The records a Kafka consumer fetched, kept per partition in offset order.

See :mod:`agentkernel.pipeline.transport.kafka` for how records are handed out per key.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from agentkernel.pipeline.envelope import QueueMessage
from agentkernel.pipeline.position import Position
from agentkernel.pipeline.transport.bookkeeping import BookkeepingStore

logger = logging.getLogger(__name__)

ATTR_PREFIX = "ak-attr:"
DEDUP_HEADER = "ak-dedup-id"


@dataclass(eq=False)
class Entry:
    offset: int
    key: str
    record: Any
    owner: Partition
    state: str = "ready"  # ready | inflight | done
    not_before: float = 0.0


@dataclass(eq=False)
class Partition:
    topic: str
    number: int
    books_key: str  # group:topic:number, for the bookkeeping store
    entries: deque[Entry] = field(default_factory=deque)
    in_flight: set[str] = field(default_factory=set)
    finished: list[int] = field(default_factory=list)  # done, not yet covered by a commit
    next_offset: int = -1
    requested: int = -1  # offset of the last commit sent
    committed: int = -1  # offset of the last commit the broker confirmed
    revoking: bool = False
    unit: str | None = None  # ordering unit of positions (names the topic id); None: no id


def advance(part: Partition) -> int:
    """Drop the finished prefix; return the offset a commit may move to (-1: nothing read)."""
    while part.entries and part.entries[0].state == "done":
        part.entries.popleft()
    return part.entries[0].offset if part.entries else part.next_offset


def message_of(entry: Entry, books: BookkeepingStore, window: float) -> QueueMessage | None:
    """The message of a picked record; ``None`` for a duplicate or a record already finished."""
    part, record = entry.owner, entry.record
    position = f"{part.topic}:{part.number}:{entry.offset}"
    headers = {k: v for k, v in (record.headers() or [])}
    dedup = headers.get(DEDUP_HEADER)
    if dedup is not None and not books.claim_dedup(dedup.decode(), position, window):
        return None  # a duplicate of a record already accepted
    count = books.start_delivery(part.books_key, entry.offset)
    if count == 0:
        logger.info("skipping %s: finished before a crash or rebalance", position)
        return None
    return QueueMessage(
        body=record.value().decode() if record.value() is not None else "",
        attributes={
            k.removeprefix(ATTR_PREFIX): v.decode()
            for k, v in headers.items()
            if k.startswith(ATTR_PREFIX)
        },
        group_id=record.key().decode() if record.key() is not None else None,
        dedup_id=dedup.decode() if dedup is not None else None,
        receive_count=count,
        message_id=position,
        position=None if part.unit is None else Position(part.unit, entry.offset),
        native=entry,
    )
