"""Checking, while a process runs, that the broker still holds what it started with.

Another process, or an operator, can change the streams under a running process: delete a
consumer or a stream, re-provision the streams for another partition count, update a
consumer's ``ack_wait``. A process that went on regardless would publish sessions to
partitions nobody serves, or misjudge its leases, and say nothing. So every
``CHECK_SECONDS`` the watch re-reads the streams and the consumers this process owns; what is
missing is recreated with ``auto_provision``, and any other difference is a *fault*: it is
logged once at ERROR, ``send`` to that queue is refused, its consumers fetch nothing and
``ping`` (``GET /ready``) fails, until the check passes again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from agentkernel.core.errors import AgentKernelError
from agentkernel.pipeline.wire.envelope import QueueName

logger = logging.getLogger(__name__)

#: Seconds between two checks of the broker's streams and consumers.
CHECK_SECONDS = 5.0


class Watch:
    """The faults of one transport's queues and the thread that finds them.

    Args:
        check: returns a queue's faults ('' when none) as (for sending, for fetching only);
            called on the watch thread.
        name: the thread's name.
        interval: seconds between checks.
    """

    def __init__(
        self,
        check: Callable[[QueueName], tuple[str, str]],
        name: str,
        interval: float = CHECK_SECONDS,
    ) -> None:
        self._check = check
        self._interval = interval
        self._faults: dict[tuple[QueueName, bool], str] = {}  # (queue, fetching only) -> fault
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self._interval + 1)

    def fault(self, queue: QueueName) -> str:
        """What keeps this process from sending to ``queue`` ('' when nothing)."""
        return self._faults.get((queue, False), "")

    def fetch_fault(self, queue: QueueName) -> str:
        """What keeps this process from fetching from ``queue`` ('' when nothing)."""
        return self.fault(queue) or self._faults.get((queue, True), "")

    def any_fault(self) -> str:
        return next(iter(self._faults.values()), "")

    def check_now(self) -> None:
        """Check every queue once (the thread does this every ``interval`` seconds)."""
        for queue in QueueName:
            try:
                sending, fetching = self._check(queue)
            except AgentKernelError:
                continue  # the broker is unreachable: ping's business, not a drift
            self._record((queue, False), sending)
            self._record((queue, True), fetching)

    def _record(self, key: tuple[QueueName, bool], fault: str) -> None:
        queue = key[0]
        before = self._faults.get(key, "")
        if fault == before:
            return
        faults = dict(self._faults)
        if fault:
            faults[key] = fault
            logger.error("%s refused: %s", queue, fault)
        else:
            faults.pop(key, None)
            logger.warning("%s works again: the streams match this process's settings", queue)
        self._faults = faults  # replaced whole: readers on other threads see one or the other

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.check_now()
