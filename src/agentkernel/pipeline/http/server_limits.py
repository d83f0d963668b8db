"""Limits the HTTP server enforces before the application sees a request (``api.limits``).

- **Header timeout** (``api.limits.header_timeout``): a connection has that long to send a
  request's line and headers, counted from the connection's start or from the first byte of a
  later request on a kept-alive connection. A client that trickles its headers (slowloris) or
  sends nothing at all is closed; one that sent part of a head gets 408 first. The body has its
  own bound, ``api.body_timeout``, checked by the chat route.
- **Header size** (``api.limits.max_header_bytes``): a larger head is answered 431 and closed,
  however it arrived. The parser's own limit only bounds a head still incomplete, so a head
  that came whole in one socket read (up to 256 KiB) would be parsed; the protocol measures
  each head on the wire before the parser reads it.
- **WebSocket message size**: ``api.max_body_bytes``, enforced by the WebSocket protocol itself,
  which refuses a frame by its declared length (close code 1009) before reading its payload.

Both head limits live in a small subclass of uvicorn's h11 protocol, so the same parser serves every
deployment (httptools, when installed, is not picked up silently with other limits).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from agentkernel.core.config import ApiConfig

__all__ = ["HeaderTimeoutProtocol", "server_options"]

logger = logging.getLogger(__name__)

#: The end of a head as the parser (h11) finds it: a blank line, ``\r`` optional.
_HEAD_END = re.compile(b"\n\r?\n")


def _closing_response(status: bytes, error: str, message: str) -> bytes:
    body = json.dumps({"error": error, "message": message}).encode()
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


_TIMEOUT_RESPONSE = _closing_response(
    b"408 Request Timeout", "HEADER_TIMEOUT", "the request headers did not arrive in time"
)
_TOO_LARGE_RESPONSE = _closing_response(
    b"431 Request Header Fields Too Large",
    "HEADERS_TOO_LARGE",
    "the request line and headers are over the server's limit",
)


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline and a size limit on each request's head."""

    #: Seconds a request's line and headers may take (set per server by :func:`server_options`).
    header_timeout: ClassVar[float] = 10.0
    #: Largest request line plus headers, in bytes (set per server by :func:`server_options`).
    max_header_bytes: ClassVar[int] = 16_384

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

    def handle_events(self) -> None:
        # Every head passes here before the parser reads it: on arrival, and when a pipelined
        # one is taken up after the previous response.
        if self.conn.their_state is h11.IDLE and self._head_too_large():
            self._refuse(_TOO_LARGE_RESPONSE, "request head over %s bytes", self.max_header_bytes)
            return
        super().handle_events()

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

    def _head_too_large(self) -> bool:
        """Whether the head waiting to be parsed is, or will be, over the limit."""
        pending, _ = self.conn.trailing_data
        end = _HEAD_END.search(pending, 0, self.max_header_bytes + 3)
        size = len(pending) if end is None else end.end()
        return size > self.max_header_bytes

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a response is still being written (pipelined head waits behind it)
        answer = _TIMEOUT_RESPONSE if self._head_started else None
        self._refuse(answer, "request head took over %ss", self.header_timeout)

    def _refuse(self, answer: bytes | None, why: str, limit: float) -> None:
        if answer is not None and not self.transport.is_closing():
            self.transport.write(answer)
        logger.debug("closed a connection: " + why, limit)
        self._disarm()
        self.transport.close()


def server_options(api: ApiConfig) -> dict[str, Any]:
    """The ``uvicorn.Config`` keyword arguments that enforce ``api``'s limits."""
    protocol = type(
        "HeaderTimeoutProtocol",
        (HeaderTimeoutProtocol,),
        {
            "header_timeout": api.limits.header_timeout,
            "max_header_bytes": api.limits.max_header_bytes,
        },
    )
    return {
        "http": protocol,
        "h11_max_incomplete_event_size": api.limits.max_header_bytes,
        "ws_max_size": api.max_body_bytes,
    }
