"""What both HTTP protocols share to bound a request's head: its deadline and the closing answers.

:class:`HeadLimits` is mixed into a uvicorn protocol (h11 or httptools) ahead of it; the protocol
says, through two hooks, whether it waits for a head and whether part of one came. See
:mod:`agentkernel.pipeline.http.server_limits` for the limits themselves.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import ClassVar

__all__ = ["TIMEOUT_RESPONSE", "TOO_LARGE_RESPONSE", "HeadLimits"]

# The limits' log lines keep the logger they always had, whichever protocol refuses.
logger = logging.getLogger("agentkernel.pipeline.http.server_limits")


def _closing_response(status: bytes, error: str, message: str) -> bytes:
    body = json.dumps({"error": error, "message": message}).encode()
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


TIMEOUT_RESPONSE = _closing_response(
    b"408 Request Timeout", "HEADER_TIMEOUT", "the request headers did not arrive in time"
)
TOO_LARGE_RESPONSE = _closing_response(
    b"431 Request Header Fields Too Large",
    "HEADERS_TOO_LARGE",
    "the request line and headers are over the server's limit",
)


class HeadLimits:
    """A deadline on each request's head, and the answer that closes a connection over a limit."""

    #: Seconds a request's line and headers may take (set per server by ``server_options``).
    header_timeout: ClassVar[float] = 10.0
    #: Largest request line plus headers, in bytes (set per server by ``server_options``).
    max_header_bytes: ClassVar[int] = 16_384

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def _start_head_clock(self) -> None:
        """Called once the connection is made: the first head's deadline runs from here."""
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm()

    def _awaiting_head(self) -> bool:
        """Whether the connection waits for a head, with no request or answer in progress."""
        raise NotImplementedError

    def _head_begun(self) -> bool:
        """Whether part of the awaited head came."""
        raise NotImplementedError

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_overdue)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._awaiting_head():
            return
        answer = TIMEOUT_RESPONSE if self._head_begun() else None
        self._refuse(answer, "request head took over %ss", self.header_timeout)

    def _refuse(self, answer: bytes | None, why: str, limit: float) -> None:
        if answer is not None and not self.transport.is_closing():
            self.transport.write(answer)
        logger.debug("closed a connection: " + why, limit)
        self._disarm()
        self.transport.close()
