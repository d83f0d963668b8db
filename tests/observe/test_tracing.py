"""OpenTelemetry: one span per turn on each side of the queue, joined by the traceparent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from agentkernel.pipeline.runtime import tracing
from tests import servers

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("otel_pipeline.py")
AGENTS = Path(__file__).with_name("agents.py")
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"


def traced(*agents: str, traceparent: str = TRACEPARENT) -> dict:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), traceparent, *agents],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_a_turn_is_three_spans_of_the_callers_trace() -> None:
    result = traced("echo")
    assert result["replies"][0]["result"] == "hi"
    spans = {s["name"]: s for s in result["spans"]}
    enqueue, run, deliver = (spans[f"agentkernel {n}"] for n in ("enqueue", "run", "deliver"))
    assert {s["trace_id"] for s in result["spans"]} == {TRACE_ID}
    assert CALLER_SPAN in ancestors(enqueue, result["spans"]) and enqueue["kind"] == "PRODUCER"
    assert run["parent"] == enqueue["span_id"] and run["kind"] == "CONSUMER"
    assert deliver["parent"] == enqueue["span_id"] and deliver["kind"] == "CONSUMER"
    request_id = result["replies"][0]["request_id"]
    for span in (enqueue, run, deliver):
        assert span["attributes"]["agentkernel.request_id"] == request_id
        assert span["attributes"]["agentkernel.session_id"] == "traced"
    assert run["attributes"]["messaging.destination.name"] == "input"
    assert spans["model call"]["parent"] == run["span_id"]  # the agent's spans nest in the run


def ancestors(span: dict, spans: list[dict]) -> list[str]:
    """Span ids from ``span``'s parent up (through the HTTP server's spans, when instrumented)."""
    by_id = {s["span_id"]: s for s in spans}
    found, parent = [], span["parent"]
    while parent is not None:
        found.append(parent)
        parent = by_id[parent]["parent"] if parent in by_id else None
    return found


def test_a_retried_delivery_is_a_failed_run_span_and_a_second_one() -> None:
    result = traced("flaky")
    assert result["replies"][0]["result"] == "second time"
    runs = [s for s in result["spans"] if s["name"] == "agentkernel run"]
    assert [(r["attributes"]["agentkernel.delivery"], r["status"]) for r in runs] == [
        (1, "ERROR"),
        (2, "UNSET"),
    ]


@pytest.mark.parametrize("header", ["", "garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01"])
def test_without_a_valid_caller_trace_the_turn_starts_its_own(header: str) -> None:
    result = traced("echo", traceparent=header)
    assert result["replies"][0]["result"] == "hi"
    assert len({s["trace_id"] for s in result["spans"]}) == 1
    assert TRACE_ID not in {s["trace_id"] for s in result["spans"]}


def test_no_span_and_no_change_without_a_tracer_provider() -> None:
    with tracing.span("run", TRACEPARENT, "CONSUMER", {}) as context:
        assert context == TRACEPARENT


class Collector(BaseHTTPRequestHandler):
    """Takes OTLP/HTTP exports as a collector would, keeping their bodies."""

    bodies: list[bytes] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        type(self).bodies.append(self.path.encode() + b" " + self.rfile.read(length))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[bytes]]]:
    bodies: list[bytes] = []
    handler = type("Handler", (Collector,), {"bodies": bodies})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    server.shutdown()
    server.server_close()


def test_the_cli_exports_the_spans_over_otlp_before_it_exits(
    collector: tuple[str, list[bytes]],
) -> None:
    endpoint, bodies = collector
    port = servers.free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentkernel", "serve", str(AGENTS), "--port", str(port)],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
            try:
                httpx.get(url + "/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        body = {"session_id": "otlp", "prompt": "0", "agent": "slow"}
        reply = httpx.post(url + "/api/v1/chat", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        proc.send_signal(signal.SIGINT)  # the batch is still buffered: the exit must flush it
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    exported = b"".join(bodies)
    assert bodies and all(b.startswith(b"/v1/traces ") for b in bodies)
    for name in (b"agentkernel enqueue", b"agentkernel run", b"agentkernel deliver"):
        assert name in exported
    assert reply.json()["request_id"].encode() in exported


RECORDING_SCRIPT = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from agentkernel.pipeline.runtime import tracing
before = tracing.recording()
if not {by_name}:
    trace.set_tracer_provider(TracerProvider())
print(before, tracing.recording())
"""


@pytest.mark.parametrize(
    ("by_name", "expected"),
    [(False, "False True"), (True, "True True")],
    ids=["set-in-code", "named-by-variable"],
)
def test_spans_are_recorded_from_the_moment_a_provider_is_set(by_name: bool, expected: str) -> None:
    """Set in code after the first turn, or named by ``OTEL_PYTHON_TRACER_PROVIDER`` (which the
    API loads on first use): either way the next span is recorded."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("OTEL_PYTHON_TRACER_PROVIDER", None)
    if by_name:
        env["OTEL_PYTHON_TRACER_PROVIDER"] = "sdk_tracer_provider"
    script = RECORDING_SCRIPT.format(by_name=by_name)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected
