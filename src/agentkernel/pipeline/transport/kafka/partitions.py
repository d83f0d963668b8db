"""The records a Kafka consumer fetched, kept per partition in offset order.

See :mod:`agentkernel.pipeline.transport.kafka` for how records are handed out per key.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agentkernel.pipeline.transport.bookkeeping import BookkeepingStore
from agentkernel.pipeline.wire.envelope import QueueMessage
from agentkernel.pipeline.wire.position import Position

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


def pick(parts: Iterable[Partition], batch_size: int, now: float) -> list[Entry]:
    """Take up to ``batch_size`` ready records whose session has nothing earlier pending, in
    offset order, and mark them in flight (the caller holds the consumer's lock)."""
    picked: list[Entry] = []
    for part in parts:
        if part.revoking:
            continue
        blocked = set(part.in_flight)
        for entry in part.entries:
            if len(picked) >= batch_size:
                return picked
            if entry.state == "done" or entry.key in blocked:
                continue
            blocked.add(entry.key)
            if entry.state == "ready" and entry.not_before <= now:
                entry.state = "inflight"
                part.in_flight.add(entry.key)
                picked.append(entry)
    return picked


def order_key(record: Any) -> str:
    """The key a record is ordered by: its session, or a key of its own when it has none.

    A key that is not UTF-8 still orders its records (by its bytes, apart from every session).
    """
    key = record.key()
    if key is None:
        return f"\0{record.offset()}"
    try:
        return str(key.decode())
    except UnicodeDecodeError:
        return f"\0{key!r}"


def message_of(entry: Entry, books: BookkeepingStore, window: float) -> QueueMessage | None:
    """The message of a picked record; ``None`` for a duplicate or a record already finished.

    A record that cannot be decoded (a key, header or value that is not UTF-8) comes out marked
    ``undecodable`` with what could be read, for the handling to dead-letter.
    """
    part, record = entry.owner, entry.record
    position = f"{part.topic}:{part.number}:{entry.offset}"
    fields = _Fields()
    headers = {k: v for k, v in (record.headers() or [])}
    dedup = fields.text("the dedup header", headers.get(DEDUP_HEADER))
    if dedup is not None and not books.claim_dedup(dedup, position, window):
        return None  # a duplicate of a record already accepted
    count = books.start_delivery(part.books_key, entry.offset)
    if count == 0:
        logger.info("skipping %s: finished before a crash or rebalance", position)
        return None
    attributes = {
        k.removeprefix(ATTR_PREFIX): fields.text(f"header {k!r}", v) or ""
        for k, v in headers.items()
        if k.startswith(ATTR_PREFIX)
    }
    return QueueMessage(
        body=fields.text("the value", record.value()) or "",
        attributes=attributes,
        group_id=fields.text("the key", record.key()),
        dedup_id=dedup,
        receive_count=count,
        message_id=position,
        position=None if part.unit is None else Position(part.unit, entry.offset),
        undecodable="; ".join(fields.defects) or None,
        native=entry,
    )


class _Fields:
    """Decodes a record's bytes, noting each field that is not UTF-8 instead of raising."""

    def __init__(self) -> None:
        self.defects: list[str] = []

    def text(self, what: str, raw: bytes | None) -> str | None:
        if raw is None:
            return None
        try:
            return raw.decode()
        except UnicodeDecodeError:
            self.defects.append(f"{what} is not UTF-8")
            return None
