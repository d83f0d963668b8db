"""Malformed and hostile HTTP/1.1 on the wire, against both protocols (httptools and h11): each
case gets a clear 4xx or a close, never a 5xx or a hang, and one reading of each request (no
smuggling). Raw sockets against the real server."""

from __future__ import annotations

import contextlib
import re
import socket
import time
from typing import Any

import pytest

from agentkernel.core.config.limits import LimitsConfig
from tests.api.conftest import Server, start_server  # noqa: F401 - fixture

STATUS = re.compile(rb"HTTP/1\.1 (\d{3}) ")
HEALTH = b'{"status":"ok"}'


@pytest.fixture
def server(parser: str, start_server: Any) -> Server:  # noqa: F811
    return start_server(body_timeout=1.0, limits=LimitsConfig(header_timeout=2.0))


def exchange(server: Server, *writes: bytes, quiet: float = 1.0) -> tuple[bytes, bool]:
    """Send ``writes`` (one socket write each, a little apart), then read until the server
    closes or stays ``quiet`` seconds: what came back, and whether the server closed."""
    host, port = server.url.removeprefix("http://").split(":")
    data, deadline = b"", time.monotonic() + 8
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each write its own segment
        for write in writes:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(write)
            time.sleep(0.05)
        sock.settimeout(quiet)
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return data, False
            except ConnectionResetError:
                return data, True
            if not chunk:
                return data, True
            data += chunk
    pytest.fail(f"the server kept talking for 8 s: {data[:300]!r}")


def statuses(data: bytes) -> list[int]:
    return [int(code) for code in STATUS.findall(data)]


def assert_refused(data: bytes, closed: bool) -> None:
    """A 4xx (or nothing) as the last answer, no 5xx, and the connection closed."""
    codes = statuses(data)
    assert closed, data[:300]
    assert all(code < 500 for code in codes), data[:300]
    assert not codes or 400 <= codes[-1] < 500, data[:300]


def head(target: bytes = b"/health", *fields: bytes, method: bytes = b"GET") -> bytes:
    lines = [method + b" " + target + b" HTTP/1.1", b"Host: x", *fields]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def chat(body: bytes, *fields: bytes) -> bytes:
    type_ = b"Content-Type: application/json"
    return head(b"/api/v1/chat", type_, *fields, method=b"POST") + body


BAD_HEADS = {
    "garbage after the version": b"GET /health HTTP/1.1 extra\r\nHost: x\r\n\r\n",
    "no version (HTTP/0.9)": b"GET /health\r\n\r\n",
    "a version from the future": b"GET /health HTTP/1.7\r\nHost: x\r\n\r\n",
    "a method with a bad byte": b"G@T /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "a control byte in the target": b"GET /he\x01alth HTTP/1.1\r\nHost: x\r\n\r\n",
    "a space in the target": b"GET /he alth HTTP/1.1\r\nHost: x\r\n\r\n",
    "a NUL in a header value": head(b"/health", b"X-A: a\x00b"),
    "a control byte in a header value": head(b"/health", b"X-A: a\x01b"),
    "a space in a header name": head(b"/health", b"X A: b"),
    "a space before the colon": head(b"/health", b"Content-Length : 0"),
    "a header line without a colon": head(b"/health", b"X-A"),
    "a bare CR in a header value": head(b"/health", b"X-A: a\rb"),
    "a first header line starting with a space": b"GET /health HTTP/1.1\r\n Host: x\r\n\r\n",
    "no Host on HTTP/1.1": b"GET /health HTTP/1.1\r\n\r\n",
    "two Host headers": head(b"/health", b"Host: y"),
    "two different lengths": chat(b"{}", b"Content-Length: 2", b"Content-Length: 3"),
    "a length with a sign": chat(b"{}", b"Content-Length: +2"),
    "a length list": chat(b"{}", b"Content-Length: 2, 2"),
    "a length over 2**64": chat(b"{}", b"Content-Length: 99999999999999999999999"),
    "length and chunked (CL.TE)": chat(
        b"0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        b"Content-Length: 40",
        b"Transfer-Encoding: chunked",
    ),
    "chunked and length (TE.CL)": chat(
        b"0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        b"Transfer-Encoding: chunked",
        b"Content-Length: 5",
    ),
    "chunked twice": chat(
        b"0\r\n\r\n", b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked"
    ),
    "a coding after chunked": chat(b"0\r\n\r\n", b"Transfer-Encoding: chunked, gzip"),
    "a coding before chunked": chat(b"0\r\n\r\n", b"Transfer-Encoding: gzip, chunked"),
    "an unknown coding": chat(b"0\r\n\r\n", b"Transfer-Encoding: xchunked"),
    "a chunk size over 2**64": chat(b"F" * 20 + b"\r\n", b"Transfer-Encoding: chunked"),
    "a chunk size that is not hex": chat(b"1x\r\na\r\n0\r\n\r\n", b"Transfer-Encoding: chunked"),
    "a chunk without its CRLF": chat(b"2\r\n{}X\r\n0\r\n\r\n", b"Transfer-Encoding: chunked"),
}


#: What h11 lets through and llhttp refuses, none of it read two ways.
H11_LENIENT = {
    "a version from the future": 200,
    "a control byte in a header value": 200,
    "a length list": 422,  # h11 takes "2, 2" as 2; the body {} is then not a chat request
}


@pytest.mark.parametrize("name", list(BAD_HEADS))
def test_a_malformed_request_is_refused_and_closed(parser: str, server: Server, name: str) -> None:
    data, closed = exchange(server, BAD_HEADS[name], quiet=3)  # h11: a body timeout, 1 s
    if parser == "h11" and name in H11_LENIENT:
        assert statuses(data) == [H11_LENIENT[name]], data[:300]
    else:
        assert_refused(data, closed)
        assert HEALTH not in data  # no request hidden in it was answered


def test_an_obs_folded_header_is_refused_or_unfolded(parser: str, server: Server) -> None:
    """RFC 9112 §5.2 lets a server do either: llhttp refuses, h11 joins the lines."""
    data, closed = exchange(server, head(b"/health", b"X-A: a", b" b", b"Connection: close"))
    if parser == "httptools":
        assert_refused(data, closed)
    else:
        assert statuses(data) == [200] and closed


@pytest.mark.parametrize(
    "upgrade",
    [b"Connection: Upgrade\r\nUpgrade: h2c", b"Connection: upgrade\r\nUpgrade: websocket"],
    ids=["h2c", "websocket"],
)
def test_a_body_on_an_upgrade_request_is_never_read_as_a_request(
    server: Server, upgrade: bytes
) -> None:
    """llhttp stops reading a request asking to upgrade at the end of its head; had its body
    been taken for the next request, a proxy that did not upgrade would see a smuggled one."""
    inner = head()
    request = chat(inner, upgrade, b"Content-Length: %d" % len(inner))
    data, _ = exchange(server, request)
    assert HEALTH not in data
    assert all(code < 500 for code in statuses(data)), data[:300]


def test_a_connect_request_with_a_body_is_never_read_as_a_request(server: Server) -> None:
    inner = head()
    request = b"CONNECT x:443 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(inner)
    data, _ = exchange(server, request + inner)
    assert HEALTH not in data
    assert all(code < 500 for code in statuses(data)), data[:300]


def test_an_h2c_upgrade_without_a_body_is_served_as_http_1_1(server: Server) -> None:
    data, _ = exchange(server, head(b"/health", b"Connection: Upgrade", b"Upgrade: h2c") + head())
    assert statuses(data) == [200, 200] and data.count(HEALTH) == 2


def test_a_get_body_that_looks_like_a_request_is_a_body(server: Server) -> None:
    inner = head()
    data, _ = exchange(server, head(b"/health", b"Content-Length: %d" % len(inner)) + inner)
    assert statuses(data) == [200] and data.count(HEALTH) == 1


def test_pipelined_requests_are_answered_in_order(server: Server) -> None:
    turn = b'{"session_id": "p", "prompt": "hi", "agent": "echo"}'
    body = chat(turn, b"Content-Length: %d" % len(turn))
    data, _ = exchange(server, head() + body + head())
    assert statuses(data) == [200, 200, 200], data[:600]
    first, second, third = re.split(rb"HTTP/1\.1 ", data)[1:]
    assert HEALTH in first and b"hi #1" in second and HEALTH in third


def test_blank_lines_inside_a_chunked_body_are_body(server: Server) -> None:
    """The httptools protocol cuts what it feeds llhttp at blank lines: here they fall inside
    chunks, across chunks and across socket writes, and the next request still follows."""
    turn = b'{"session_id": "c",\r\n\r\n"prompt": "hi"}'
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (turn[:18], turn[18:]))
    request = chat(chunks + b"0\r\n\r\n", b"Transfer-Encoding: chunked")
    writes = [request[i : i + 7] for i in range(0, len(request), 7)] + [head()]
    data, _ = exchange(server, *writes)
    assert statuses(data) == [200, 200], data[:600]
    assert b"hi #1" in data and HEALTH in data


def test_a_head_split_inside_its_blank_line_is_served(server: Server) -> None:
    request = head()
    for split in (len(request) - 1, len(request) - 2, len(request) - 3):
        data, _ = exchange(server, request[:split], request[split:])
        assert statuses(data) == [200], (split, data[:300])


def test_blank_lines_before_a_request_are_skipped_or_refused(parser: str, server: Server) -> None:
    """RFC 9112 §2.2: a server SHOULD skip them; llhttp does, h11 answers 400."""
    data, closed = exchange(server, b"\r\n\r\n" + head())
    if parser == "httptools":
        assert statuses(data) == [200]
    else:
        assert_refused(data, closed)


def test_bare_lf_line_ends_are_refused_or_read(parser: str, server: Server) -> None:
    """RFC 9112 §2.2 lets a server take a bare LF as a line's end: h11 does, llhttp refuses."""
    data, closed = exchange(server, b"GET /health HTTP/1.1\nHost: x\nConnection: close\n\n")
    if parser == "httptools":
        assert_refused(data, closed)
    else:
        assert statuses(data) == [200] and closed


def test_a_request_after_connection_close_is_not_answered(server: Server) -> None:
    data, closed = exchange(server, head(b"/health", b"Connection: close") + head())
    assert statuses(data) == [200] and closed


def test_a_bad_request_behind_a_slow_one_is_answered_after_it(server: Server) -> None:
    """llhttp reads the second request while the first is being answered: its 400 waits, as
    it does with h11, which reads it only after the first answer."""
    turn = b'{"session_id": "w", "prompt": "x", "agent": "slow", "seconds": 0.3}'
    data, closed = exchange(server, chat(turn, b"Content-Length: %d" % len(turn)) + b"BAD\r\n\r\n")
    assert statuses(data) == [200, 400] and closed, data[:600]


def test_a_bad_chunk_behind_a_slow_request_is_answered_after_it(server: Server) -> None:
    turn = b'{"session_id": "w", "prompt": "x", "agent": "slow", "seconds": 0.3}'
    second = chat(b"zz\r\n", b"Transfer-Encoding: chunked")
    data, closed = exchange(server, chat(turn, b"Content-Length: %d" % len(turn)) + second)
    codes = statuses(data)
    assert closed and codes[-1] == 400 and all(code < 500 for code in codes), data[:600]


def test_a_stalled_chunked_body_gets_the_body_timeout(server: Server) -> None:
    data, closed = exchange(server, chat(b"40\r\n{", b"Transfer-Encoding: chunked"), quiet=3)
    assert statuses(data) == [408] and b"BODY_TIMEOUT" in data and closed


def test_a_huge_announced_chunk_gets_the_body_timeout_not_a_buffer(server: Server) -> None:
    data, closed = exchange(server, chat(b"FFFFFFFF\r\n{", b"Transfer-Encoding: chunked"), quiet=3)
    assert statuses(data) == [408] and closed


def test_pipelined_heads_up_to_the_limit_are_served_and_the_next_one_over_is_refused(
    server: Server,
) -> None:
    limit = LimitsConfig().max_header_bytes
    data, closed = exchange(server, head() + sized_head(limit) + sized_head(limit + 1) + head())
    assert statuses(data) == [200, 200, 431] and closed, data[:600]


def test_a_chunked_body_full_of_blank_lines_is_served(server: Server) -> None:
    """The httptools protocol cuts a chunked body at each blank line: 100,000 of them in one
    request stay a matter of well under a second."""
    turn = b'{"session_id": "b",' + b"\r\n" * 100_000 + b'"prompt": "hi"}'
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(turn[i : i + 65536]), turn[i : i + 65536])
        for i in range(0, len(turn), 65536)
    )
    host, port = server.url.removeprefix("http://").split(":")
    data = b""
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=8) as sock:
        sock.sendall(chat(chunks + b"0\r\n\r\n", b"Transfer-Encoding: chunked"))
        while b"hi #1" not in data and (chunk := sock.recv(65536)):  # until the reply, not a
            data += chunk  # quiet spell: a loaded machine may take over a second to answer
    assert statuses(data) == [200] and b"hi #1" in data, data[:300]
    assert time.monotonic() - started < 3


def sized_head(size: int) -> bytes:
    """A GET /health head of exactly ``size`` bytes (one padding header)."""
    start, end = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ", b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end
