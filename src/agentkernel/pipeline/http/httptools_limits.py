"""uvicorn's httptools (llhttp) protocol with the head limits of ``api.limits``.

llhttp parses everything it is given at once, pipelined requests included, has no size limit on a
head and tells no offsets. So the protocol feeds it in pieces it cuts itself: a piece that starts
while a head is awaited ends at the first blank line (CRLF CRLF: llhttp takes no bare LF), where a
head can end; a body of known length is one piece; a chunked body is cut at blank lines too (its
last chunk ends with one). Each head's
bytes are thus counted on the wire, and refused (431) before llhttp reads them. If llhttp ever
frames a request differently from these cuts (a request starting inside a piece after another
ended, or a body inside a head's piece), the request is refused 400 rather than counted wrong.

Where llhttp is more lenient than h11, the head is checked as h11 checks it (400 otherwise):
exactly one ``Host`` on HTTP/1.1, HTTP/1.0 or 1.1 only, ``chunked`` as the only transfer coding,
no body on an upgrade or CONNECT request (llhttp would not read that body, and would parse it as
the next request). A 400 or 431 for a request behind others is written after their answers.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from agentkernel.pipeline.http.head_limits import TOO_LARGE_RESPONSE, HeadLimits

__all__ = ["HttptoolsLimitsProtocol"]

logger = logging.getLogger(__name__)

#: Where a head or a chunked body can end for llhttp, which takes no bare LF for a line's end.
_BLANK_LINE = b"\r\n\r\n"


class _BadHead(Exception):
    """Raised in a parser callback: llhttp stops and uvicorn answers 400."""


class HttptoolsLimitsProtocol(HeadLimits, HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline and a size limit on each request's head."""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._in_head = True  # a head is awaited (or arriving); False while a body arrives
        self._head_bytes = 0  # of the awaited head, so far
        self._body_left: int | None = None  # of a body of known length; None: chunked
        self._tail = b""  # the last 3 bytes fed, where a blank line may have begun
        self._piece_in_head = True  # whether the piece being fed started while a head was awaited
        self._piece_ended_one = False  # whether a request ended inside the piece being fed
        self._refusal: Callable[[], None] | None = None  # an answer waiting for earlier ones
        self._start_head_clock()

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return  # the connection closes once the earlier answers are written
        view, start = memoryview(data), 0  # pieces are views: no copy of the rest per cut
        while start < len(data):
            end = self._cut(data, start)
            if self._in_head and self._head_bytes + end - start > self.max_header_bytes:
                self._after_answers(self._refuse_too_large)
                return
            self._feed(view[start:end])
            if self._stopped_reading():
                return
            start = end
        if self._in_head and self._head_bytes:  # part of a head: the deadline runs from here
            self._arm()
        else:
            self._disarm()

    def _stopped_reading(self) -> bool:
        """Refused (now or after earlier answers), or upgraded to WebSocket, which reads no more
        of this data (as with h11)."""
        refused = self._refusal is not None or self.transport.is_closing()
        return refused or self.transport.get_protocol() is not self

    def _cut(self, data: bytes, start: int) -> int:
        """Where the next piece from ``start`` ends (see the module docstring)."""
        if not self._in_head and self._body_left is not None:
            return start + (min(len(data) - start, self._body_left) or len(data) - start)
        if self._tail:  # a blank line may have begun in the last piece
            found = (self._tail + data[start : start + 3]).find(_BLANK_LINE)
            if found != -1:
                return start + found + 4 - len(self._tail)
        found = data.find(_BLANK_LINE, start)
        return len(data) if found == -1 else found + 4

    def _feed(self, piece: memoryview) -> None:
        self._piece_in_head, self._piece_ended_one = self._in_head, False
        if self._in_head:
            self._head_bytes += len(piece)
        elif self._body_left is not None:
            self._body_left -= len(piece)
        self._tail = (self._tail + piece[-3:].tobytes())[-3:]
        super().data_received(piece)  # type: ignore[arg-type]  # httptools reads a view in place

    # -- parser callbacks: the cuts checked against llhttp's framing, the head as h11 checks it

    def on_message_begin(self) -> None:
        if self._piece_ended_one:
            raise _BadHead("a request began inside the piece where the previous one ended")
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        body_left = self._check_head()
        self._in_head, self._head_bytes, self._body_left = False, 0, body_left
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._piece_in_head:
            raise _BadHead("a body began inside the piece that ended the head")
        super().on_body(body)

    def on_chunk_header(self) -> None:
        if self._piece_in_head:
            raise _BadHead("a chunk began inside the piece that ended the head")

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._piece_ended_one = True, True
        self._head_bytes, self._body_left, self._tail = 0, None, b""

    def _check_head(self) -> int | None:
        """The body's length (``None``: chunked), once the head passes what h11 checks and
        llhttp does not, and has no body llhttp would leave unread."""
        hosts, codings, length = 0, [], 0
        for name, value in self.headers:
            if name == b"host":
                hosts += 1
            elif name == b"transfer-encoding":
                codings.append(value.strip().lower())
            elif name == b"content-length":
                length = int(value)  # llhttp refused any but one, in digits
        version = self.parser.get_http_version()
        if version not in ("1.0", "1.1"):
            self._bad_head("HTTP version %s", version)
        if hosts > 1 or (hosts == 0 and version == "1.1"):
            self._bad_head("%s Host headers", hosts)
        if codings and codings != [b"chunked"]:
            self._bad_head("transfer coding %r", b", ".join(codings))
        if self.parser.should_upgrade() and (codings or length):
            self._bad_head("a body on an upgrade or CONNECT request%s", "")
        return None if codings else length  # llhttp refused a head with both

    def _bad_head(self, why: str, detail: object) -> None:
        logger.debug("refused a request head: " + why, detail)
        raise _BadHead(why % detail)

    # -- answers written in order: a refusal waits for the answers to earlier requests

    def send_400_response(self, msg: str) -> None:
        self._after_answers(functools.partial(HttpToolsProtocol.send_400_response, self, msg))

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._refusal is not None and not self._answer_pending():
            refusal, self._refusal = self._refusal, None
            if not self.transport.is_closing():
                refusal()
        elif self._in_head and self._head_bytes:  # a pipelined head waited behind that answer
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _after_answers(self, refusal: Callable[[], None]) -> None:
        if not self._answer_pending():
            refusal()
            return
        self._refusal = refusal
        self._disarm()
        self.flow.pause_reading()

    def _answer_pending(self) -> bool:
        """Whether a request before the one in hand, read whole, still waits for its answer."""
        cycle = self.cycle
        return cycle is not None and not cycle.more_body and not cycle.response_complete

    def _refuse_too_large(self) -> None:
        self._refuse(TOO_LARGE_RESPONSE, "request head over %s bytes", self.max_header_bytes)

    def _awaiting_head(self) -> bool:
        idle = self.cycle is None or self.cycle.response_complete
        return idle and self._in_head and self._refusal is None

    def _head_begun(self) -> bool:
        return self._head_bytes > 0
