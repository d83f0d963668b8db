"""Start moto's server with fixes for two races: its SQS FIFO receive, and its conditional
writes to DynamoDB.

moto's ``receive_message`` reads the set of in-flight message groups once per call and takes no
lock, so two receive calls that overlap can each take a message from the same group: two turns of
one session in flight at once, which AWS never does. A long poll keeps that first reading for up
to 20 s, so it also ignores a group that became busy after it started, and holds back the next
message of a group that was busy when it started but is free again (a session's next turn then
waited out the poll: 20 s per turn in the chaos suite's poison scenario). Here every receive is
serialised, so concurrent consumers see each other's groups, as on AWS (the lock is held for a
few milliseconds), and a long poll is a series of such short polls, 50 ms apart, until one finds
a message or the wait is over.

moto's DynamoDB ``update_item`` (and ``put_item``, ``delete_item``) checks the condition, then
parses and applies the update, with no lock between: two conditional writes of one item that
overlap can both pass their condition, where DynamoDB applies conditional writes to an item one
at a time. Each write is serialised here (the turn signals' compare-and-sets rely on it).

Usage: python tests/moto_server.py -H 127.0.0.1 -p PORT   (the moto_server arguments)
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

from moto.dynamodb.models import DynamoDBBackend
from moto.server import main
from moto.sqs.models import SQSBackend

_receive = SQSBackend.receive_message
#: How often a long poll looks again.
LONG_POLL_STEP_SECONDS = 0.05
_lock = threading.Lock()


@functools.wraps(_receive)
def _serialised_receive(
    self: SQSBackend,
    queue_name: str,
    count: int,
    wait_seconds_timeout: int,
    *args: Any,
    **kwargs: Any,
) -> Any:
    deadline = time.monotonic() + wait_seconds_timeout
    while True:
        with _lock:
            result = _receive(self, queue_name, count, 0, *args, **kwargs)
        if result or time.monotonic() >= deadline:
            return result
        time.sleep(LONG_POLL_STEP_SECONDS)


SQSBackend.receive_message = _serialised_receive  # type: ignore[method-assign]

_write_lock = threading.Lock()


def _serialised(write: Any) -> Any:
    @functools.wraps(write)
    def serialised(*args: Any, **kwargs: Any) -> Any:
        with _write_lock:
            return write(*args, **kwargs)

    return serialised


for _name in ("put_item", "update_item", "delete_item", "transact_write_items"):
    setattr(DynamoDBBackend, _name, _serialised(getattr(DynamoDBBackend, _name)))

if __name__ == "__main__":
    main()
