"""A draining IO process answers or refuses every connection; it never resets one it took."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter

import httpx

from agentkernel.pipeline.http.listener import accept_backlog, refuse_new_connections

from .conftest import Server, make_config, registry

CLIENTS = 6


def _hammer(url: str, stop: threading.Event, seen: Counter[str], lock: threading.Lock) -> None:
    """GET /health on a fresh connection each time, until the server is gone."""
    with httpx.Client(base_url=url, timeout=5) as client:
        while not stop.is_set():
            try:
                client.get("/health", headers={"Connection": "close"})
                outcome = "answered"
            except (httpx.RemoteProtocolError, httpx.ReadError):
                outcome = "cut"
            except httpx.ConnectError:
                outcome = "refused"
                time.sleep(0.01)
            except httpx.HTTPError as exc:
                outcome = type(exc).__name__
            with lock:
                seen[outcome] += 1


def test_no_connection_is_cut_while_the_server_stops() -> None:
    from agentkernel.pipeline.process.io_handler import IOHandler

    handler = IOHandler(make_config(), registry=registry(), with_runner=True)
    server = Server(handler)
    seen: Counter[str] = Counter()
    lock, stop = threading.Lock(), threading.Event()
    clients = [
        threading.Thread(target=_hammer, args=(server.url, stop, seen, lock))
        for _ in range(CLIENTS)
    ]
    for thread in clients:
        thread.start()
    try:
        time.sleep(0.5)
        server.close()  # the clients keep connecting through the whole shutdown
        time.sleep(1.5)  # a SYN dropped at the end is sent again after about a second
    finally:
        stop.set()
        for thread in clients:
            thread.join(10)
    assert seen["answered"] > 20, seen
    assert seen["cut"] == 0, seen
    assert set(seen) <= {"answered", "refused"}, seen


def test_queued_connections_are_kept_and_new_ones_refused_cleanly() -> None:
    listener = socket.create_server(("127.0.0.1", 0), backlog=16)
    port = listener.getsockname()[1]
    queued = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
    for sock in queued:
        sock.sendall(b"ping")
    _wait(lambda: accept_backlog(listener) == 3)
    assert refuse_new_connections(listener)
    late: list[BaseException | str] = []

    def connect_late() -> None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            late.append("connected")
        except OSError as exc:
            late.append(exc)

    latecomer = threading.Thread(target=connect_late)
    latecomer.start()
    time.sleep(0.3)
    assert accept_backlog(listener) == 3  # the late handshake did not complete
    for _ in queued:
        conn, _ = listener.accept()
        assert conn.recv(4) == b"ping"
        conn.sendall(b"pong")
        conn.close()
    assert [sock.recv(4) for sock in queued] == [b"pong"] * 3
    for sock in queued:
        sock.close()
    listener.close()
    latecomer.join(10)
    assert len(late) == 1 and isinstance(late[0], ConnectionRefusedError), late


def _wait(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
