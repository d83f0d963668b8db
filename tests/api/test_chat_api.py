"""The HTTP API over a real uvicorn server and the embedded pipeline."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest

from agentkernel.client import ChatClient, ChatError
from agentkernel.core.errors import TransportError
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore
from agentkernel.pipeline.transport.in_memory import InMemoryTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName
from agentkernel.pipeline.wire.records import ResponseRecord

from .conftest import ATTEMPTS, Server, make_config, poll, registry


def chat(server: Server, session: str, prompt: str, **extra: object) -> httpx.Response:
    return server.client.post(
        "/api/v1/chat", json={"session_id": session, "prompt": prompt, **extra}
    )


def test_sync_turn_returns_the_reply(server: Server) -> None:
    response = chat(server, "s1", "hello", agent="echo")
    assert response.status_code == 200
    doc = response.json()
    assert doc["result"] == "hello #1"
    assert doc["session_id"] == "s1" and doc["agent"] == "echo" and len(doc["request_id"]) == 32


def test_state_carries_across_turns_of_a_session_only(server: Server) -> None:
    assert chat(server, "a", "one").json()["result"] == "one #1"
    assert chat(server, "a", "two").json()["result"] == "two #2"
    assert chat(server, "b", "other").json()["result"] == "other #1"


def test_async_turn_is_accepted_then_polled_repeatedly(server: Server) -> None:
    response = server.client.post(
        "/api/v1/chat",
        json={"session_id": "s", "prompt": "p", "agent": "slow", "seconds": 0.4},
        headers={"Prefer": "respond-async"},
    )
    assert response.status_code == 202
    doc = response.json()
    assert doc["status"] == "ACCEPTED" and doc["session_id"] == "s"
    assert response.headers["location"] == f"/api/v1/chat/s?request_id={doc['request_id']}"
    early = server.client.get("/api/v1/chat/s", params={"request_id": doc["request_id"]})
    assert (early.status_code, early.json()["error"]) == (404, "PENDING")
    assert early.headers["retry-after"] == "1"
    ready = poll(server.client, "s", doc["request_id"])
    assert (ready.status_code, ready.json()["result"]) == (200, "slept")
    again = server.client.get("/api/v1/chat/s", params={"request_id": doc["request_id"]})
    assert again.json() == ready.json()  # reads are repeatable until the TTL


def test_async_mode_from_configuration(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(mode="rest_async")
    response = chat(server, "s", "hi")
    assert response.status_code == 202
    assert poll(server.client, "s", response.json()["request_id"]).json()["result"] == "hi #1"


def test_reply_is_never_readable_under_another_session(server: Server) -> None:
    request_id = chat(server, "owner", "secret").json()["request_id"]
    other = server.client.get("/api/v1/chat/intruder", params={"request_id": request_id})
    assert other.status_code == 404
    assert other.json()["error"] == "NOT_FOUND"
    assert "secret" not in other.text


def test_agent_exception_is_a_readable_500(server: Server) -> None:
    response = chat(server, "s", "x", agent="broken")
    assert response.status_code == 500
    doc = response.json()
    assert doc["error"] == "AGENT_ERROR"
    assert doc["message"] == "agent 'broken' failed: ValueError: the model said no"
    assert "Traceback" not in response.text


def test_retryable_failure_ends_in_an_error_reply(server: Server) -> None:
    response = chat(server, "s", "x", agent="flaky")
    assert response.status_code == 500
    doc = response.json()
    assert doc["error"] == "TURN_FAILED"
    assert ATTEMPTS[doc["request_id"]] == 2  # max_receive_count is 2 in these tests
    metrics = server.client.get("/metrics").text
    assert 'agentkernel_redeliveries_total{queue="input"} 2' in metrics  # deliveries 2 and 3
    assert 'agentkernel_permanent_failures_total{queue="input"} 1' in metrics
    assert 'agentkernel_turns_total{agent="flaky",status="retry"} 2' in metrics


def test_a_reply_names_the_delivery_that_produced_it(server: Server) -> None:
    """``attempt`` is 1 for a turn answered at once, 2 for one redelivered after a
    RetryableError; a streamed turn's ``done`` frame carries it too."""
    assert chat(server, "a1", "hi", agent="echo").json()["attempt"] == 1
    answered = chat(server, "a2", "hi", agent="once")
    assert answered.status_code == 200
    assert (answered.json()["result"], answered.json()["attempt"]) == ("answered late", 2)
    body = {"session_id": "a3", "prompt": "hi", "agent": "once"}
    sse = {"Accept": "text/event-stream"}
    with server.client.stream("POST", "/api/v1/chat", json=body, headers=sse) as response:
        frames = [json.loads(x[6:]) for x in response.iter_lines() if x.startswith("data: ")]
    assert [f.get("delta") for f in frames] == ["answered ", "late", None]
    assert (frames[-1]["done"], frames[-1]["attempt"]) == (True, 2)
    polled = poll(server.client, "a3", frames[-1]["request_id"]).json()
    assert (polled["result"], polled["attempt"]) == ("answered late", 2)
    metrics = server.client.get("/metrics").text
    assert 'agentkernel_redeliveries_total{queue="input"} 2' in metrics  # one per "once" turn


def test_trace_context_travels_through_the_queue(server: Server) -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    response = server.client.post(
        "/api/v1/chat",
        json={"session_id": "t", "prompt": "x", "agent": "trace"},
        headers={"traceparent": traceparent},
    )
    assert response.json()["result"] == traceparent
    fresh = chat(server, "t", "y", agent="trace").json()["result"]
    assert fresh.startswith("00-") and fresh != traceparent  # a new trace when none was sent


def test_timeout_answers_504_with_the_request_id_to_poll(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(sync_timeout=0.2)
    response = chat(server, "s", "x", agent="slow", seconds=0.6)
    assert response.status_code == 504
    request_id = response.json()["request_id"]
    assert poll(server.client, "s", request_id).json()["result"] == "slept"


def test_streaming_agent_reply_is_joined_for_rest(server: Server) -> None:
    assert chat(server, "s", "a b c", agent="words").json()["result"] == "a b c "


def test_idempotency_key_returns_the_same_turn(server: Server) -> None:
    headers = {"Idempotency-Key": "k-1"}
    body = {"session_id": "idem", "prompt": "once"}
    first = server.client.post("/api/v1/chat", json=body, headers=headers)
    second = server.client.post("/api/v1/chat", json=body, headers=headers)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert chat(server, "idem", "next").json()["result"] == "next #2"  # the agent ran once before


def test_a_reused_idempotency_key_with_another_body_is_422_and_runs_nothing(
    server: Server,
) -> None:
    headers = {"Idempotency-Key": "k-reused"}
    first = server.client.post(
        "/api/v1/chat", json={"session_id": "reuse", "prompt": "pay 10"}, headers=headers
    )
    assert first.json()["result"] == "pay 10 #1"
    for changed in ({"prompt": "pay 99"}, {"prompt": "pay 10", "agent": "slow"}):
        again = server.client.post(
            "/api/v1/chat", json={"session_id": "reuse", **changed}, headers=headers
        )
        assert (again.status_code, again.json()["error"]) == (422, "IDEMPOTENCY_KEY_REUSED")
        assert "pay 10" not in again.text  # the first body's reply is not handed out
    same = server.client.post(
        "/api/v1/chat", json={"prompt": "pay 10", "session_id": "reuse"}, headers=headers
    )
    assert same.json() == first.json()  # same content in another key order is the same turn
    assert chat(server, "reuse", "next").json()["result"] == "next #2"


def test_a_reused_idempotency_key_is_refused_while_the_first_turn_still_runs(
    server: Server,
) -> None:
    headers = {"Idempotency-Key": "k-running", "Prefer": "respond-async"}
    body = {"session_id": "run", "prompt": "a", "agent": "slow", "seconds": 0.5}
    first = server.client.post("/api/v1/chat", json=body, headers=headers)
    assert first.status_code == 202
    other = server.client.post("/api/v1/chat", json=body | {"seconds": 0.1}, headers=headers)
    assert (other.status_code, other.json()["error"]) == (422, "IDEMPOTENCY_KEY_REUSED")
    retry = server.client.post("/api/v1/chat", json=body, headers=headers)
    assert retry.status_code == 202 and retry.json()["request_id"] == first.json()["request_id"]


def test_get_tells_a_running_turn_from_an_unknown_or_foreign_one(server: Server) -> None:
    accepted = server.client.post(
        "/api/v1/chat",
        json={"session_id": "mine", "prompt": "p", "agent": "slow", "seconds": 0.5},
        headers={"Prefer": "respond-async"},
    )
    request_id = accepted.json()["request_id"]
    running = server.client.get("/api/v1/chat/mine", params={"request_id": request_id})
    assert (running.status_code, running.json()["error"]) == (404, "PENDING")
    assert running.json()["request_id"] == request_id
    foreign = server.client.get("/api/v1/chat/yours", params={"request_id": request_id})
    unknown = server.client.get("/api/v1/chat/mine", params={"request_id": "0" * 32})
    for answer in (foreign, unknown):
        assert (answer.status_code, answer.json()["error"]) == (404, "NOT_FOUND")
        assert "retry-after" not in answer.headers
    assert poll(server.client, "mine", request_id).json()["result"] == "slept"


def test_fifty_rapid_turns_keep_order_while_other_sessions_proceed(server: Server) -> None:
    ids = []
    for i in range(50):
        response = server.client.post(
            "/api/v1/chat",
            json={"session_id": "busy", "prompt": str(i)},
            headers={"Prefer": "respond-async"},
        )
        assert response.status_code == 202
        ids.append(response.json()["request_id"])
    started = time.monotonic()
    assert chat(server, "quiet", "hi").json()["result"] == "hi #1"
    assert time.monotonic() - started < 2.0
    results = [poll(server.client, "busy", rid).json()["result"] for rid in ids]
    assert results == [f"{i} #{i + 1}" for i in range(50)]


def test_sessions_run_in_parallel(server: Server) -> None:
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        responses = list(
            pool.map(lambda i: chat(server, f"p{i}", "x", agent="slow", seconds=0.5), range(20))
        )
    assert all(r.status_code == 200 for r in responses)
    assert time.monotonic() - started < 3.0  # 20 x 0.5 s one after another would be 10 s


class RefusingTransport(InMemoryTransport):
    """A broker that is down for INPUT."""

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        if queue == QueueName.INPUT:
            raise TransportError("broker unreachable")
        return super().send(queue, message)


def test_enqueue_failure_is_503_with_the_request_id_to_resolve_it(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(transport=RefusingTransport())
    started = time.monotonic()
    response = chat(server, "s", "x")
    assert response.status_code == 503
    doc = response.json()
    assert doc["error"] == "QUEUE_UNAVAILABLE"
    assert response.headers["location"] == f"/api/v1/chat/s?request_id={doc['request_id']}"
    assert response.headers["retry-after"] == "1"
    assert time.monotonic() - started < 2.0
    # nothing reached the queue, and polling says so instead of hanging
    assert server.client.get(response.headers["location"]).status_code == 404


class AmbiguousTransport(InMemoryTransport):
    """A broker that takes the first INPUT message but answers as if it failed (lost ack)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed_once = False

    def send(self, queue: QueueName, message: QueueMessage) -> str | None:
        message_id = super().send(queue, message)
        if queue == QueueName.INPUT and not self.failed_once:
            self.failed_once = True
            raise TransportError("publish timed out")
        return message_id


def test_a_503_after_an_ambiguous_enqueue_can_be_polled(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(transport=AmbiguousTransport())
    refused = chat(server, "amb", "hello")
    assert refused.status_code == 503
    ran = poll(server.client, "amb", refused.json()["request_id"])
    assert (ran.status_code, ran.json()["result"]) == (200, "hello #1")
    assert server.client.get(refused.headers["location"]).json() == ran.json()


def test_a_retry_with_the_same_idempotency_key_never_runs_the_turn_twice(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(transport=AmbiguousTransport())
    body = {"session_id": "idem-503", "prompt": "once", "delay": 0.5}
    headers = {"Idempotency-Key": "k-503"}
    refused = server.client.post("/api/v1/chat", json=body, headers=headers)
    assert refused.status_code == 503
    # retried while the first copy still runs: only the broker's dedup can stop a second run
    retried = server.client.post("/api/v1/chat", json=body, headers=headers)
    assert retried.status_code == 200, retried.text
    assert retried.json()["request_id"] == refused.json()["request_id"]
    assert retried.json()["result"] == "once #1"
    # the broker dropped the retry's copy as a duplicate: the session saw the prompt once
    assert chat(server, "idem-503", "next").json()["result"] == "next #2"


def test_504_carries_the_location_to_poll(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(sync_timeout=0.2)
    response = chat(server, "s 504", "x", agent="slow", seconds=0.6)
    assert response.status_code == 504
    assert poll(server.client, "s 504", response.json()["request_id"]).status_code == 200
    assert server.client.get(response.headers["location"]).json()["result"] == "slept"


class ExplodingStore(InMemoryResponseStore):
    """A store with a bug: an exception nobody mapped."""

    def get(self, request_id: str) -> ResponseRecord | None:
        raise RuntimeError("bug")


def test_an_unexpected_error_is_a_json_500(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(store=ExplodingStore())
    response = server.client.get("/api/v1/chat/s", params={"request_id": "r"})
    assert (response.status_code, response.json()["error"]) == (500, "INTERNAL_ERROR")
    assert "Traceback" not in response.text and "bug" not in response.text


def test_service_routes(server: Server) -> None:
    assert server.client.get("/health").json() == {"status": "ok"}
    ready = server.client.get("/ready")
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")
    agents = server.client.get("/api/v1/agents").json()
    names = ["echo", "slow", "broken", "flaky", "once", "words", "trace"]
    assert agents["agents"] == names  # upstream's shape: the names
    assert [a["name"] for a in agents["details"]] == names
    chat(server, "m", "x")
    metrics = server.client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'agentkernel_turns_total{agent="echo",status="ok"} 1' in metrics.text
    assert 'agentkernel_queue_depth{queue="input"} 0' in metrics.text
    spec = server.client.get("/openapi.json").json()
    post = spec["paths"]["/api/v1/chat"]["post"]
    assert {"200", "202", "413", "422", "503", "504"} <= set(post["responses"])
    assert (
        "session_id" in post["requestBody"]["content"]["application/json"]["schema"]["properties"]
    )


CLOSED: list[str] = []


class ClosingTransport(InMemoryTransport):
    def close(self) -> None:
        CLOSED.append("transport")


class ClosingStore(InMemoryResponseStore):
    def close(self) -> None:
        CLOSED.append("store")


def test_the_clients_it_created_are_closed_in_order_after_the_drain() -> None:
    CLOSED.clear()
    config = make_config()
    execution = config.execution.model_copy(
        update={
            "queues": config.execution.queues.model_copy(
                update={"type": f"{__name__}.ClosingTransport"}
            ),
            "response_store": config.execution.response_store.model_copy(
                update={"type": f"{__name__}.ClosingStore"}
            ),
        }
    )
    handler = IOHandler(
        config.model_copy(update={"execution": execution}), registry=registry(), with_runner=True
    )
    server = Server(handler)
    assert chat(server, "c", "hi").json()["result"] == "hi #1"
    assert CLOSED == []
    server.close()
    assert CLOSED == ["transport", "store"]


def test_chat_client_polls_after_a_504_under_any_session_id(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(sync_timeout=0.2)
    client = ChatClient(server.url, timeout=20)
    try:
        for session in ("q?x=1", "h#frag", "pct%2F", "ü s"):
            assert client.ask(session, "p", agent="slow") == "slept"  # 0.5 s: a 504, then polls
    finally:
        client.close()


def test_chat_client_gives_up_at_its_own_timeout(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server()  # the server itself would wait 60 s
    client = ChatClient(server.url, timeout=0.3)
    started = time.monotonic()
    try:
        with pytest.raises(ChatError, match=r"no reply within 0.3s"):
            client.ask("patient", "p", agent="slow", seconds=5)
        async_started = time.monotonic()
        with pytest.raises(
            ChatError, match=r"still running: poll http://\S+/api/v1/chat/patient\?request_id="
        ):
            client.ask("patient", "p", agent="slow", asynchronous=True, seconds=5)
        assert time.monotonic() - async_started < 3
    finally:
        client.close()
    assert time.monotonic() - started < 6
