"""A message on its last allowed delivery runs alone in its process (the poison-turn lane)."""

from __future__ import annotations

import asyncio
import threading
import time

from agentkernel.pipeline.consumer.loop import ConsumerLoop
from agentkernel.pipeline.transport.base import TransportConsumer
from agentkernel.pipeline.wire.envelope import QueueMessage


class Scripted(TransportConsumer):
    """Hands out a fixed list of messages (with chosen delivery counts), one per fetch.

    Async, as the loop's API is: a fetch and the handling it starts run on one event loop, so
    "nothing is fetched once a suspect was" is exact. (Blocking consumers fetch on threads of
    their own: a fetch already running in another consumer's thread when the suspect arrives
    may still return, and its messages then run before the suspect, never beside it.)
    """

    def __init__(self, pending: list[QueueMessage], log: list[tuple[str, str, float]]) -> None:
        self.pending, self.log = pending, log
        self.lock = threading.Lock()

    async def fetch(self, batch_size: int, wait_seconds: float) -> list[QueueMessage]:
        with self.lock:
            message = self.pending.pop(0) if self.pending else None
        if message is None:
            await asyncio.sleep(min(wait_seconds, 0.05))
            return []
        self.log.append(("fetch", message.body, time.monotonic()))
        return [message]

    async def ack(self, message: QueueMessage) -> None:
        self.log.append(("ack", message.body, time.monotonic()))


def message(name: str, attempt: int) -> QueueMessage:
    return QueueMessage(body=name, group_id=name, receive_count=attempt, message_id=name)


def run_loop(pending: list[QueueMessage], isolate: bool) -> list[tuple[str, str, float]]:
    log: list[tuple[str, str, float]] = []
    consumer = Scripted(pending, log)
    total = len(pending)

    async def process(m: QueueMessage) -> None:
        log.append(("start", m.body, time.monotonic()))
        await asyncio.sleep(0.3)
        log.append(("end", m.body, time.monotonic()))

    loop = ConsumerLoop.from_handlers(
        process=process,
        on_permanent_failure=lambda m: None,
        consumer_factory=lambda: consumer,
        max_receive_count=3,
        num_consumers=2,
        wait_seconds=0.1,
        isolate_last_attempt=isolate,
    )
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while sum(1 for e in log if e[0] == "ack") < total:
        assert time.monotonic() < deadline, f"not all messages finished: {log}"
        time.sleep(0.02)
    loop.stop()
    thread.join(10)
    assert not thread.is_alive()
    return log


def spans(log: list[tuple[str, str, float]]) -> dict[str, tuple[float, float]]:
    starts = {name: t for kind, name, t in log if kind == "start"}
    return {name: (starts[name], t) for kind, name, t in log if kind == "end"}


def test_a_last_attempt_runs_alone_and_nothing_is_fetched_meanwhile() -> None:
    pending = [message("a", 1), message("b", 2), message("suspect", 3)]
    pending += [message(f"late{i}", 1) for i in range(3)]
    log = run_loop(pending, isolate=True)
    times = spans(log)
    alone = times.pop("suspect")
    for name, (start, end) in times.items():
        assert end <= alone[0] or start >= alone[1], f"{name} ran beside the suspect: {log}"
    fetched_late = [t for kind, name, t in log if kind == "fetch" and name.startswith("late")]
    assert min(fetched_late) >= alone[1], "the loop fetched while the suspect ran"


def test_without_isolation_the_suspect_shares_the_process() -> None:
    pending = [message("a", 1), message("suspect", 3), message("late", 1)]
    times = spans(run_loop(pending, isolate=False))
    start, end = times.pop("suspect")
    assert any(s < end and e > start for s, e in times.values())
