"""A webhook receiver for tests: a real HTTP server on 127.0.0.1 that records every POST and
answers each with the next status of a plan (the last one repeats)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    """One POST as it arrived: when (monotonic seconds), its headers and its raw body."""

    at: float
    path: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    """Records POSTs; ``statuses`` are the answers, in order."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.received: list[Received] = []
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                headers = {k: v for k, v in self.headers.items()}
                status = receiver._record(Received(time.monotonic(), self.path, headers, body))
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook?tenant=t1"

    def _record(self, received: Received) -> int:
        with self._cond:
            self.received.append(received)
            self._cond.notify_all()
            index = len(self.received) - 1
            return self.statuses[min(index, len(self.statuses) - 1)]

    def wait(self, count: int, timeout: float = 10.0) -> list[Received]:
        """The first ``count`` POSTs, waiting up to ``timeout`` seconds for them."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.received) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"{len(self.received)} webhooks arrived, expected {count}"
                self._cond.wait(left)
            return list(self.received)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
