"""Limits the HTTP server enforces before the application sees a request (``api.limits``).

- **Header timeout** (``api.limits.header_timeout``): a connection has that long to send a
  request's line and headers, counted from the connection's start or from the first byte of a
  later request on a kept-alive connection. A client that trickles its headers (slowloris) or
  sends nothing at all is closed; one that sent part of a head gets 408 first. The body has its
  own bound, ``api.body_timeout``, checked by the chat route.
- **Header size** (``api.limits.max_header_bytes``): a larger head is answered 431 and closed,
  however it arrived. Neither parser's own limit is relied on (h11's only bounds a head still
  incomplete, llhttp has none): the protocol measures each head on the wire before the parser
  reads it, whether it trickles in, comes whole in one socket read, or waits pipelined.
- **WebSocket message size**: ``api.max_body_bytes``, enforced by the WebSocket protocol itself,
  which refuses a frame by its declared length (close code 1009) before reading its payload.

Both head limits live in a small subclass of a uvicorn protocol. The server uses uvicorn's
httptools (llhttp, in C) protocol when ``httptools`` can be imported, as it is a dependency, for its
lower CPU per request; uvicorn's pure-Python h11 protocol otherwise. Both enforce the limits with
the same answers and log lines, and both refuse ambiguous framing (400, closed); where the RFC
lets a server choose, their answers to malformed input differ (docs/limits.md).
:mod:`agentkernel.pipeline.http.httptools_limits` says what llhttp needed on top.
"""

from __future__ import annotations

import re
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from agentkernel.core.config.api import ApiConfig
from agentkernel.pipeline.http.head_limits import TOO_LARGE_RESPONSE, HeadLimits

__all__ = ["HeaderTimeoutProtocol", "http_protocol", "server_options"]

#: The end of a head as h11 finds it: a blank line, ``\r`` optional.
_HEAD_END = re.compile(b"\n\r?\n")


class _OneFraming(h11.Connection):
    """h11 refusing a request that has both ``Content-Length`` and ``Transfer-Encoding``.

    h11 reads such a body as chunked and keeps the connection open, so what a proxy in front
    took for one request by its length could be two here (request smuggling). RFC 9112 §6.3
    lets a server refuse it; llhttp does.
    """

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        event = super().next_event()
        if isinstance(event, h11.Request):
            names = {name for name, _ in event.headers}
            if b"content-length" in names and b"transfer-encoding" in names:
                raise h11.RemoteProtocolError("both Content-Length and Transfer-Encoding")
        return event


class HeaderTimeoutProtocol(HeadLimits, H11Protocol):
    """uvicorn's h11 protocol with a deadline and a size limit on each request's head."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        limit = self.config.h11_max_incomplete_event_size or self.max_header_bytes
        self.conn = _OneFraming(h11.SERVER, limit)  # nothing was read yet
        self._head_started = False
        self._start_head_clock()

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
            self._refuse(TOO_LARGE_RESPONSE, "request head over %s bytes", self.max_header_bytes)
            return
        super().handle_events()

    def on_response_complete(self) -> None:
        self._head_started = False  # the keep-alive timeout covers the idle time from here
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _awaiting_head(self) -> bool:
        # A pipelined head waits behind a response still being written.
        idle = self.cycle is None or self.cycle.response_complete
        return idle and self.conn.their_state is h11.IDLE

    def _head_begun(self) -> bool:
        return self._head_started

    def _head_too_large(self) -> bool:
        """Whether the head waiting to be parsed is, or will be, over the limit."""
        pending, _ = self.conn.trailing_data
        end = _HEAD_END.search(pending, 0, self.max_header_bytes + 3)
        size = len(pending) if end is None else end.end()
        return size > self.max_header_bytes


def http_protocol() -> type[HeadLimits]:
    """The httptools protocol when ``httptools`` can be imported, else the h11 one."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return HeaderTimeoutProtocol
    from agentkernel.pipeline.http.httptools_limits import HttptoolsLimitsProtocol

    return HttptoolsLimitsProtocol


def server_options(api: ApiConfig) -> dict[str, Any]:
    """The ``uvicorn.Config`` keyword arguments that enforce ``api``'s limits."""
    base = http_protocol()
    limits = {
        "header_timeout": api.limits.header_timeout,
        "max_header_bytes": api.limits.max_header_bytes,
    }
    return {
        "http": type(base.__name__, (base,), limits),
        "h11_max_incomplete_event_size": api.limits.max_header_bytes,
        "ws_max_size": api.max_body_bytes,
    }
