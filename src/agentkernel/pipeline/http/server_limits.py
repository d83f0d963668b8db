"""Limits the HTTP server enforces before the application sees a request (``api.limits``).

- **Header timeout** (``api.limits.header_timeout``): a connection has that long to send a
  request's line and headers, counted from the connection's start or from the first byte of a
  later request on a kept-alive connection. A client that trickles its headers (slowloris) or
  sends nothing at all is closed; one that sent part of a head gets 408 first. The body has its
  own bound, ``api.body_timeout``, checked by the chat route.
- **Header size** (``api.limits.max_header_bytes``): a larger head is answered 400 and closed.
- **WebSocket message size**: ``api.max_body_bytes``, enforced by the WebSocket protocol itself,
  which refuses a frame by its declared length (close code 1009) before reading its payload.

The header timeout is a small subclass of uvicorn's h11 protocol, so the same parser serves every
deployment (httptools, when installed, is not picked up silently with other limits).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from agentkernel.core.config import ApiConfig

__all__ = ["HeaderTimeoutProtocol", "server_options"]

logger = logging.getLogger(__name__)

_TIMEOUT_BODY = json.dumps(
    {"error": "HEADER_TIMEOUT", "message": "the request headers did not arrive in time"}
).encode()
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: " + str(len(_TIMEOUT_BODY)).encode() + b"\r\n\r\n" + _TIMEOUT_BODY
)


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's head."""

    #: Seconds a request's line and headers may take (set per server by :func:`server_options`).
    header_timeout: ClassVar[float] = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_started = False
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # part of a head: the deadline runs from here
            self._head_started = True
            self._arm()
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        self._head_started = False  # the keep-alive timeout covers the idle time from here
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_overdue)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a response is still being written (pipelined head waits behind it)
        if self._head_started:
            self.transport.write(_TIMEOUT_RESPONSE)
        logger.debug("closed a connection whose request head took over %ss", self.header_timeout)
        self.transport.close()


def server_options(api: ApiConfig) -> dict[str, Any]:
    """The ``uvicorn.Config`` keyword arguments that enforce ``api``'s limits."""
    protocol = type(
        "HeaderTimeoutProtocol",
        (HeaderTimeoutProtocol,),
        {"header_timeout": api.limits.header_timeout},
    )
    return {
        "http": protocol,
        "h11_max_incomplete_event_size": api.limits.max_header_bytes,
        "ws_max_size": api.max_body_bytes,
    }
