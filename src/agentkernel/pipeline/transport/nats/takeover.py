"""What a new owner of a partition finds pending from before it owned it.

Every message a former owner was delivered and did not settle is still in the work-queue
stream (a settled one is deleted) at a sequence the partition consumer has already delivered
(at most ``delivered.stream_seq``, above ``ack_floor``). Read once, right after the claim and
before the first pull: the former owner's pull requests ended before its lease did (see
:mod:`.owners`), so nothing more is delivered to it. Each such message becomes a ``remote``
entry that holds its session's later messages (see :mod:`.book`).
"""

from __future__ import annotations

from typing import Any

from nats.js.errors import NotFoundError

from agentkernel.pipeline.transport.nats.book import Book, session_key
from agentkernel.pipeline.transport.nats.envelope import ENVELOPE_HEADER, decode_envelope


async def take_over(js: Any, stream: str, subject: str, partition: int, now: float) -> Book:
    """The book of a partition just claimed, with the messages pending from before.

    Args:
        js: the JetStream context.
        stream: the queue's stream; its partition consumer is ``<stream>-p<partition>``.
        subject: the partition's subject.
        now: loop time, for the entries.
    """
    info = await js.consumer_info(stream, f"{stream}-p{partition}")
    delivered = info.delivered.stream_seq if info.delivered else 0
    cursor = (info.ack_floor.stream_seq if info.ack_floor else 0) + 1
    book = Book(partition)
    while cursor <= delivered:
        try:
            raw = await js.get_msg(stream, seq=cursor, subject=subject, next=True)
        except NotFoundError:
            break
        if raw.seq is None or raw.seq > delivered:
            break
        try:
            group, _ = decode_envelope((raw.headers or {}).get(ENVELOPE_HEADER))
        except ValueError:
            group = None
        book.blocker(raw.seq, session_key(group, raw.seq), now)
        cursor = raw.seq + 1
    return book
