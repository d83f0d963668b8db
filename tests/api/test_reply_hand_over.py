"""The embedded topology hands a reply to the response handler in the runner's task instead of
sending it on OUTPUT, when OUTPUT holds nothing of its session; what the queue guarantees holds
either way (order behind a stream's chunks, dedup, retries of a failed store write)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from agentkernel.core.errors import StoreUnavailableError
from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from agentkernel.pipeline.wire.records import ResponseRecord

from .conftest import Server
from .test_streaming import stream_turn


class CountingTransport(InMemoryTransport):
    """The in-memory queues, counting the messages sent to each."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: Counter[QueueName] = Counter()

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        self.sent[QueueName(queue)] += 1
        return super().send(queue, message)


class FailsOnce(InMemoryResponseStore):
    """An in-memory store whose first write of a reply fails as an unreachable store's would."""

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[str] = []

    def put(self, record: ResponseRecord) -> None:
        self.puts.append(record.request_id)
        if len(self.puts) == 1:
            raise StoreUnavailableError("the store blinked")
        super().put(record)


def chat(server: Server, session: str, prompt: str) -> dict[str, str]:
    response = server.client.post("/api/v1/chat", json={"session_id": session, "prompt": prompt})
    assert response.status_code == 200, response.text
    return response.json()


def test_sync_replies_are_handed_over_without_an_output_message(
    start_server: Callable[..., Server],
) -> None:
    transport = CountingTransport()
    server = start_server(transport=transport)
    assert [chat(server, "s", p)["result"] for p in ("a", "b", "c")] == ["a #1", "b #2", "c #3"]
    assert transport.sent == {QueueName.INPUT: 3}
    assert transport.depth(QueueName.OUTPUT) == transport.in_flight(QueueName.OUTPUT) == 0


def test_a_reply_the_store_refuses_goes_through_output_and_still_arrives(
    start_server: Callable[..., Server],
) -> None:
    transport, store = CountingTransport(), FailsOnce()
    server = start_server(transport=transport, store=store)
    reply = chat(server, "s", "hello")
    assert reply["result"] == "hello #1"
    assert store.puts == [reply["request_id"]] * 2  # refused in place, then stored from OUTPUT
    assert transport.sent == {QueueName.INPUT: 1, QueueName.OUTPUT: 1}
    assert chat(server, "s", "again")["result"] == "again #2"  # and the next is handed over
    assert transport.sent[QueueName.OUTPUT] == 1


def test_a_streamed_reply_still_follows_its_chunks(start_server: Callable[..., Server]) -> None:
    transport = CountingTransport()
    server = start_server(transport=transport)
    for turn in range(5):
        frames = [event[1] for event in stream_turn(server, "s", "words")]
        assert [f.get("delta") for f in frames] == ["go ", None], turn
        assert frames[-1]["done"] is True and frames[-1]["result"] == "go "
    # chunks always travel on OUTPUT; a final reply may too, when a chunk is still there
    assert transport.sent[QueueName.OUTPUT] >= 5
    assert chat(server, "s", "then")["result"] == "then #1"
