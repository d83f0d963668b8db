"""Limits the server enforces before the application reads a request: header timeout, header
size, WebSocket frame size (issue 24). Raw sockets and a real WebSocket client against uvicorn."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from typing import Any

import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import ConnectionClosedError

from agentkernel.core.config.api import ApiConfig
from agentkernel.core.config.limits import LimitsConfig
from agentkernel.pipeline.http.httptools_limits import HttptoolsLimitsProtocol
from agentkernel.pipeline.http.server_limits import HeaderTimeoutProtocol, server_options
from tests.api.conftest import Server, start_server  # noqa: F401 - fixture

PROTOCOLS = {"httptools": HttptoolsLimitsProtocol, "h11": HeaderTimeoutProtocol}


@pytest.fixture(autouse=True)
def _each_parser(parser: str) -> str:
    """Every case here runs against both protocols."""
    return parser


def connect(server: Server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def read_until_closed(sock: socket.socket, limit: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    started, data = time.monotonic(), b""
    sock.settimeout(limit)
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pytest.fail(f"the server held the connection past {limit}s")
    except ConnectionResetError:
        pass
    return data, time.monotonic() - started


@pytest.fixture
def strict(start_server: Any) -> Server:  # noqa: F811
    return start_server(limits=LimitsConfig(header_timeout=1.0, max_header_bytes=4096))


def test_a_silent_connection_is_closed_after_the_header_timeout(strict: Server) -> None:
    with connect(strict) as sock:
        data, took = read_until_closed(sock, limit=5)
    assert data == b"" and 0.8 < took < 3


def test_trickled_headers_get_408_after_the_header_timeout(strict: Server) -> None:
    with connect(strict) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        sock.settimeout(0.3)
        data = b""
        for _ in range(20):  # a byte every 0.3 s: each one used to restart nothing, hold forever
            try:
                sock.sendall(b"X")
                data += sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if data:
                break
        took = time.monotonic() - started
    assert data.startswith(b"HTTP/1.1 408"), data
    assert b"HEADER_TIMEOUT" in data and took < 3


def test_a_kept_alive_connection_gets_a_fresh_deadline_per_request(strict: Server) -> None:
    with connect(strict) as sock:
        for _ in range(3):
            time.sleep(0.6)  # under the keep-alive timeout; headers then arrive at once
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.settimeout(5)
            data = b""
            while not data.endswith(b'{"status":"ok"}'):
                data += sock.recv(65536)
            assert data.startswith(b"HTTP/1.1 200")


def test_a_slow_body_still_gets_the_body_timeout_not_the_header_timeout(
    start_server: Any,  # noqa: F811
) -> None:
    server = start_server(body_timeout=0.5, limits=LimitsConfig(header_timeout=5.0))
    with connect(server) as sock:
        sock.sendall(
            b"POST /api/v1/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        data, took = read_until_closed(sock, limit=5)
    assert data.startswith(b"HTTP/1.1 408") and b"BODY_TIMEOUT" in data and took < 3


def test_headers_over_the_size_limit_are_refused(strict: Server) -> None:
    with connect(strict) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 6000)
        time.sleep(0.2)  # the server has buffered an incomplete head over the limit
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"a" * 2000 + b"\r\n\r\n")
        data, _ = read_until_closed(sock, limit=5)
    assert data.startswith(b"HTTP/1.1 431"), data
    assert b"HEADERS_TOO_LARGE" in data


def head(size: int) -> bytes:
    """A GET /health head of exactly ``size`` bytes (one padding header)."""
    start, end = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ", b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


@pytest.mark.parametrize("size", [100 * 1024, 16_385])
def test_a_head_over_the_limit_in_one_write_is_refused_whatever_the_read_size(
    start_server: Any,  # noqa: F811
    size: int,
) -> None:
    """Seen in issue 24: a head that arrived whole in one socket read was parsed up to 256 KiB,
    because the parser's limit only bounds an incomplete head."""
    server = start_server()  # the default limit, 16 KiB
    with connect(server) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head(size))
        data, _ = read_until_closed(sock, limit=5)
    assert data.startswith(b"HTTP/1.1 431"), data[:200]
    assert b'{"status":"ok"}' not in data


def test_a_pipelined_head_over_the_limit_is_refused_after_the_first_answer(
    start_server: Any,  # noqa: F811
) -> None:
    server = start_server()
    with connect(server) as sock:
        sock.sendall(head(200) + head(100 * 1024))  # both heads arrive in one read
        data, _ = read_until_closed(sock, limit=5)
    first, _, rest = data.partition(b'{"status":"ok"}')
    assert first.startswith(b"HTTP/1.1 200"), data[:200]
    assert rest.startswith(b"HTTP/1.1 431"), data[:400]


def test_a_head_just_under_the_limit_is_served(start_server: Any) -> None:  # noqa: F811
    server = start_server()
    with connect(server) as sock:
        sock.sendall(head(LimitsConfig().max_header_bytes))
        sock.settimeout(5)
        data = b""
        while not data.endswith(b'{"status":"ok"}'):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    assert data.startswith(b"HTTP/1.1 200")


def test_the_default_header_timeout_is_bounded() -> None:
    assert 0 < LimitsConfig().header_timeout <= 30


def test_the_server_runs_httptools_when_it_can_be_imported_else_h11(
    parser: str,
    start_server: Any,  # noqa: F811
) -> None:
    api = ApiConfig(limits=LimitsConfig(header_timeout=3.0, max_header_bytes=5000))
    protocol = server_options(api)["http"]
    assert issubclass(protocol, PROTOCOLS[parser])
    assert (protocol.header_timeout, protocol.max_header_bytes) == (3.0, 5000)
    running = start_server().handler.server.config.http
    assert issubclass(running, PROTOCOLS[parser])


# -- WebSocket frames over api.max_body_bytes are refused by their declared length ----------


def test_a_websocket_frame_over_the_limit_is_refused_before_its_payload_is_read(
    start_server: Any,  # noqa: F811
) -> None:
    server = start_server(max_body_bytes=65536)
    url = server.url.replace("http://", "ws://") + "/ws"
    with ws_client.connect(url, max_size=None) as ws:
        # a text frame header announcing 16 MiB, then only 64 KiB of it: the server must close
        # on the header alone (1009), never waiting for (or buffering) the other 16 MB
        mask = b"\x01\x02\x03\x04"
        header = b"\x81" + bytes([0x80 | 127]) + struct.pack("!Q", 16 * 1024 * 1024) + mask
        ws.socket.sendall(header + b"\x00" * 65536)
        with pytest.raises(ConnectionClosedError) as closed:
            ws.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


def test_a_websocket_frame_within_the_limit_is_served(start_server: Any) -> None:  # noqa: F811
    server = start_server(max_body_bytes=65536)
    url = server.url.replace("http://", "ws://") + "/ws"
    with ws_client.connect(url) as ws:
        ws.send(json.dumps({"session_id": "ok", "prompt": "x" * 60000, "agent": "echo"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "CHAT_QUEUED"
