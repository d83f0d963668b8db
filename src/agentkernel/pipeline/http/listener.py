"""Closing a listening socket without resetting the connections the kernel already accepted.

The kernel completes TCP handshakes on its own and queues them until the server calls
``accept``. Closing the listening socket resets every queued connection: a client that already
sent its request sees ``Connection reset by peer`` without an answer, not knowing whether its
turn was taken. A draining server therefore first stops new handshakes, then accepts and answers
what is queued, and only then closes the socket.

On Linux, new handshakes are stopped with a socket filter on the listening socket that drops
connection requests (a TCP segment with SYN and without ACK). A client then sends its SYN again
about a second later, by which time the socket is closed and the connection is refused cleanly
(or a replacement process took the port and answers it). Elsewhere these calls do nothing and
the socket is closed as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import struct
import sys
from collections.abc import Iterator
from typing import Protocol

_SO_ATTACH_FILTER = 26
_SO_DETACH_FILTER = 27
#: ``tcp_info``: eight one-byte fields, then ``rto, ato, snd_mss, rcv_mss, unacked``; on a
#: listening socket ``unacked`` is the number of connections waiting to be accepted.
_TCP_INFO_SIZE = 104
_BACKLOG_OFFSET = 8 + 4 * 4
#: Classic BPF, run on the TCP header: drop a segment with SYN set and ACK unset, keep the rest
#: (the last step of a handshake already in progress is an ACK, so it still completes).
_DROP_SYN = (
    (0x30, 0, 0, 13),  # ldb [13]          TCP flags
    (0x54, 0, 0, 0x12),  # and #SYN|ACK
    (0x15, 0, 1, 0x02),  # jeq #SYN, drop, keep
    (0x06, 0, 0, 0),  # drop: ret #0
    (0x06, 0, 0, 0xFFFFFFFF),  # keep: ret #-1 (the whole segment)
)


class ListeningSocket(Protocol):
    """What is used of a listening socket (``socket.socket`` or asyncio's wrapper)."""

    def fileno(self) -> int: ...


def refuse_new_connections(sock: ListeningSocket) -> bool:
    """Stop the kernel from completing new handshakes on ``sock``; queued ones stay.

    Returns:
        ``True`` when the filter is in place (Linux), ``False`` where it is not supported.
    """
    if not sys.platform.startswith("linux"):
        return False
    program = b"".join(struct.pack("HBBI", *insn) for insn in _DROP_SYN)
    buffer = ctypes.create_string_buffer(program)
    fprog = struct.pack("HL", len(_DROP_SYN), ctypes.addressof(buffer))
    try:
        with _same_socket(sock) as twin:
            twin.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
    except OSError:
        return False
    return True  # the kernel copied the program: the buffer may go


def accept_new_connections(sock: ListeningSocket) -> None:
    """Undo :func:`refuse_new_connections` on ``sock``: a listening socket handed from one
    process to the next (``serve --reload``) keeps the filter the stopped process attached."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError), _same_socket(sock) as twin:  # OSError: no filter
        twin.setsockopt(socket.SOL_SOCKET, _SO_DETACH_FILTER, 0)


def accept_backlog(sock: ListeningSocket) -> int:
    """Connections the kernel accepted on ``sock`` that the server has not taken yet.

    Returns 0 where the platform does not tell.
    """
    if not sys.platform.startswith("linux"):
        return 0
    try:
        with _same_socket(sock) as twin:
            info = twin.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
    except OSError:
        return 0
    return int(struct.unpack_from("I", info, _BACKLOG_OFFSET)[0])


@contextlib.contextmanager
def _same_socket(sock: ListeningSocket) -> Iterator[socket.socket]:
    """A second descriptor of the same socket (options set on it apply to ``sock``)."""
    twin = socket.socket(fileno=socket.dup(sock.fileno()))
    try:
        yield twin
    finally:
        twin.close()
