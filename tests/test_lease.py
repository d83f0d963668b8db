"""LeaseKeeper: leases are extended on time, even when one broker call hangs."""

from __future__ import annotations

import threading
import time

from agentkernel.pipeline.consumer.lease import LeaseKeeper
from agentkernel.pipeline.transport.base import TransportConsumer
from agentkernel.pipeline.wire.envelope import QueueMessage


class Recorder(TransportConsumer):
    """Records extension times; an extension of a message whose body is 'hang' blocks."""

    def __init__(self, lease: float) -> None:
        self.lease = lease
        self.extended: dict[str, list[float]] = {}
        self.release = threading.Event()

    @property
    def lease_seconds(self) -> float:
        return self.lease

    def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        return []

    def ack(self, message: QueueMessage) -> None:
        pass

    def extend_lease(self, message: QueueMessage) -> None:
        self.extended.setdefault(message.body, []).append(time.monotonic())
        if message.body == "hang":
            self.release.wait(10)


def test_a_hanging_extension_does_not_delay_the_others() -> None:
    consumer = Recorder(lease=0.3)
    keeper = LeaseKeeper("test-leases")
    try:
        keeper.track(consumer, QueueMessage(body="hang"))
        keeper.track(consumer, QueueMessage(body="ok"))
        time.sleep(1.0)
        # every 0.1 s: about nine extensions of "ok" while "hang" is stuck in its first call
        assert len(consumer.extended.get("ok", [])) >= 5
        assert len(consumer.extended["hang"]) == 1  # not called again while the first runs
    finally:
        consumer.release.set()
        keeper.stop()


def test_extensions_come_every_third_of_the_lease() -> None:
    consumer = Recorder(lease=0.6)
    keeper = LeaseKeeper("test-leases")
    message = QueueMessage(body="m")
    try:
        started = time.monotonic()
        keeper.track(consumer, message)
        time.sleep(0.75)
        keeper.untrack(message)
        times = [t - started for t in consumer.extended["m"]]
        assert 2 <= len(times) <= 4 and times[0] >= 0.19
    finally:
        keeper.stop()
