"""The runner's HTTP port: /health, /ready, /metrics over real HTTP, and hostile requests."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator, Mapping

import httpx
import pytest

from agentkernel.core.errors import AKConfigError, StoreDataLostError
from agentkernel.pipeline.runtime.health_server import HealthServer
from agentkernel.pipeline.runtime.metrics import METRICS


def ok() -> None:
    return None


def down() -> None:
    raise ConnectionError("secret-host:6379 refused")


@pytest.fixture
def serve() -> Iterator[Callable[..., str]]:
    servers: list[HealthServer] = []

    def start(
        checks: Mapping[str, Callable[[], None]] | None = None,
        stopping: Callable[[], bool] = lambda: False,
    ) -> str:
        server = HealthServer("127.0.0.1", 0, checks or {"broker": ok}, stopping).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}"

    yield start
    for server in servers:
        server.stop()


def test_health_answers_while_the_process_runs(serve: Callable[..., str]) -> None:
    reply = httpx.get(serve() + "/health", timeout=5)
    assert (reply.status_code, reply.json()) == (200, {"status": "ok"})


def test_ready_names_each_check(serve: Callable[..., str]) -> None:
    url = serve({"broker": ok, "session_store": ok})
    reply = httpx.get(url + "/ready", timeout=10)
    assert reply.status_code == 200
    assert reply.json() == {"status": "ready", "broker": "ok", "session_store": "ok"}


def test_ready_is_503_naming_what_is_down_without_its_message(serve: Callable[..., str]) -> None:
    def lost() -> None:
        raise StoreDataLostError("gone")

    reply = httpx.get(serve({"broker": down, "session_store": lost}) + "/ready", timeout=10)
    assert reply.status_code == 503
    doc = reply.json()
    assert doc["broker"] == "unavailable: ConnectionError"
    assert doc["session_store"] == "data_lost"
    assert "secret-host" not in reply.text


def test_ready_is_503_while_draining_and_health_stays_200(serve: Callable[..., str]) -> None:
    draining = threading.Event()
    url = serve(stopping=draining.is_set)
    assert httpx.get(url + "/ready", timeout=10).status_code == 200
    draining.set()
    reply = httpx.get(url + "/ready", timeout=10)
    assert (reply.status_code, reply.json()["status"]) == (503, "draining")
    assert httpx.get(url + "/health", timeout=5).status_code == 200


def test_metrics_is_prometheus_text_with_the_turns(serve: Callable[..., str]) -> None:
    METRICS.reset()
    METRICS.inc("agentkernel_turns_total", agent="echo", status="ok")
    METRICS.observe("agentkernel_turn_duration_seconds", 0.2, agent="echo")
    reply = httpx.get(serve() + "/metrics?name[]=x", timeout=5)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'agentkernel_turns_total{agent="echo",status="ok"} 1' in reply.text
    assert 'agentkernel_turn_duration_seconds_count{agent="echo"} 1' in reply.text


def test_replayed_turns_are_rendered() -> None:
    METRICS.reset()
    METRICS.inc("agentkernel_turns_replayed_total")
    assert "\nagentkernel_turns_replayed_total 1\n" in METRICS.render()


@pytest.mark.parametrize("path", ["/", "/healthz", "/health/x", "/%00", "/" + "a" * 5000])
def test_other_paths_are_404_json(serve: Callable[..., str], path: str) -> None:
    reply = httpx.get(serve() + path, timeout=5)
    assert reply.status_code == 404 and reply.json()["error"] == "NOT_FOUND"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "HEAD"])
def test_other_methods_are_refused(serve: Callable[..., str], method: str) -> None:
    reply = httpx.request(method, serve() + "/health", timeout=5)
    assert reply.status_code == 405


def test_a_malformed_request_does_not_stop_the_server(serve: Callable[..., str]) -> None:
    url = serve()
    port = int(url.rsplit(":", 1)[1])
    for garbage in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\r\n\r\n", b"GET\r\n\r\n", b"\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(garbage)
            sock.recv(1024)  # an error answer or a close, never a hang
    assert httpx.get(url + "/health", timeout=5).status_code == 200


def test_a_taken_port_is_a_configuration_error_naming_the_key() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AKConfigError, match=r"execution.runner.health_port: cannot listen"):
            HealthServer("127.0.0.1", port, {})
