"""The HTTP port of a process that serves no API (an Agent Runner): health, readiness, metrics.

``execution.runner.health_port`` turns it on for ``agentkernel runner`` and
``ECSAgentRunner.run()``; the container recipes set it, and their probes use it:

- ``GET /health``: 200 while the process answers (liveness), draining included;
- ``GET /ready``: 200 when the broker and the session store answer within
  ``READY_CHECK_SECONDS``, 503 naming what is down, and 503 ``draining`` once a shutdown began;
- ``GET /metrics``: the process's metrics in Prometheus text format (turns, their duration,
  redeliveries, permanent failures).

It runs the standard library's threaded HTTP server on daemon threads: a probe must answer while
the turns' event loop is busy, and the port takes no client traffic. Nothing on it needs
authentication or reveals a payload; keep it off public networks all the same.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agentkernel.core.errors import AKConfigError
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.runtime.readiness import readiness
from agentkernel.pipeline.runtime.thread_runner import ThreadRunner

__all__ = ["HealthServer"]

logger = logging.getLogger(__name__)

#: Seconds a probe connection may stay silent before it is closed.
REQUEST_TIMEOUT_SECONDS = 5.0
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class HealthServer:
    """Serves ``/health``, ``/ready`` and ``/metrics`` on its own threads.

    Args:
        host: interface to listen on.
        port: TCP port (0: any free one; see :attr:`port`).
        checks: readiness checks by name (``transport.ping``, ``sessions.ping``); each raises
            when what it checks is down.
        stopping: whether the process is draining (``/ready`` answers 503 then); default the
            process's shutdown event.

    Raises:
        AKConfigError: the port cannot be listened on (named as ``execution.runner.health_port``).
    """

    def __init__(
        self,
        host: str,
        port: int,
        checks: Mapping[str, Callable[[], None]],
        stopping: Callable[[], bool] = ThreadRunner.shutdown_event.is_set,
    ) -> None:
        attributes = {"checks": checks, "stopping": staticmethod(stopping)}
        handler = type("ProbeHandler", (_ProbeHandler,), attributes)
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise AKConfigError(
                f"execution.runner.health_port: cannot listen on {host}:{port}: {exc.strerror}"
            ) from exc
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.1,), name="health-http", daemon=True
        )

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        """Start answering; returns itself."""
        self._thread.start()
        logger.info("health, readiness and metrics on http://%s:%s", *self._address())
        return self

    def stop(self) -> None:
        """Stop answering and release the port."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def _address(self) -> tuple[str, int]:
        host = str(self._server.server_address[0])
        return host, self.port


class _ProbeHandler(BaseHTTPRequestHandler):
    checks: Mapping[str, Callable[[], None]]
    stopping: Callable[[], bool]
    timeout = REQUEST_TIMEOUT_SECONDS
    protocol_version = "HTTP/1.1"
    server_version = "agentkernel"
    sys_version = ""

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._json(200, {"status": "ok"})
        elif path == "/ready":
            self._ready()
        elif path == "/metrics":
            self._send(200, METRICS.render().encode(), METRICS_TYPE)
        else:
            self._json(404, {"error": "NOT_FOUND", "message": "no such route"})

    def do_HEAD(self) -> None:
        self._json(405, {"error": "METHOD_NOT_ALLOWED", "message": "use GET"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD

    def _ready(self) -> None:
        if self.stopping():
            self._json(503, {"status": "draining", "error": "NOT_READY"})
            return
        self._json(*asyncio.run(readiness(self.checks, [])))

    def _json(self, status: int, doc: Mapping[str, Any]) -> None:
        self._send(status, json.dumps(doc).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Probes come every few seconds: their lines go to DEBUG, not to standard error."""
        logger.debug("%s " + format, self.address_string(), *args)
