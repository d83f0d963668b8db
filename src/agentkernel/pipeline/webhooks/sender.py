"""One webhook POST, to an address that was checked (never to a fresh resolution of the name).

``http.client`` is used rather than a full client on purpose: it follows no redirect (a 3xx to
an internal address is just an answer), reads no proxy settings from the environment, and lets
the connection be opened to a given address while the ``Host`` header and the TLS name (SNI and
certificate check) stay the URL's host.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from dataclasses import dataclass

from agentkernel.pipeline.webhooks.urls import IPAddress, Target

#: Bytes of a receiver's answer read (and dropped) before the connection is closed.
MAX_ANSWER_BYTES = 65_536
#: Longest ``Retry-After`` honoured, in seconds.
MAX_RETRY_AFTER_SECONDS = 600.0


@dataclass(frozen=True)
class Timeouts:
    """Seconds to connect (TCP and TLS) and to wait for each read of the answer."""

    connect: float
    read: float


@dataclass(frozen=True)
class Answer:
    """What the receiver said: its status and, when it gave one, ``Retry-After`` in seconds."""

    status: int
    retry_after: float | None = None


class _PinnedHTTP(http.client.HTTPConnection):
    """Plain HTTP to ``address``; the ``Host`` header still names the URL's host."""

    def __init__(self, target: Target, address: IPAddress, timeouts: Timeouts) -> None:
        super().__init__(target.host, target.port, timeout=timeouts.connect)
        self._address, self._read_timeout = address, timeouts.read

    def _open(self) -> socket.socket:
        sock = socket.create_connection((str(self._address), self.port), self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def connect(self) -> None:
        self.sock = self._open()
        self.sock.settimeout(self._read_timeout)


class _PinnedHTTPS(_PinnedHTTP):
    """TLS to ``address``, verifying the certificate against the URL's host name."""

    def __init__(
        self, target: Target, address: IPAddress, timeouts: Timeouts, tls: ssl.SSLContext
    ) -> None:
        super().__init__(target, address, timeouts)
        self._tls = tls

    def connect(self) -> None:
        raw = self._open()
        try:
            self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise
        self.sock.settimeout(self._read_timeout)


def post(
    target: Target,
    addresses: list[IPAddress],
    body: bytes,
    headers: dict[str, str],
    timeouts: Timeouts,
    tls: ssl.SSLContext,
) -> Answer:
    """POST ``body`` to the first of ``addresses`` that takes a connection.

    Raises:
        OSError: no address could be reached, or the exchange failed (timeouts included).
        http.client.HTTPException: the answer is not HTTP.
    """
    connection = _connect(target, addresses, timeouts, tls)
    try:
        connection.request("POST", target.path, body=body, headers=headers)
        response = connection.getresponse()
        response.read(MAX_ANSWER_BYTES)
        return Answer(response.status, _retry_after(response.getheader("Retry-After")))
    finally:
        connection.close()


def _connect(
    target: Target, addresses: list[IPAddress], timeouts: Timeouts, tls: ssl.SSLContext
) -> _PinnedHTTP:
    error: OSError = OSError(f"no address for {target.host}")
    for address in addresses:
        if target.scheme == "https":
            connection: _PinnedHTTP = _PinnedHTTPS(target, address, timeouts, tls)
        else:
            connection = _PinnedHTTP(target, address, timeouts)
        try:
            connection.connect()
            return connection
        except OSError as exc:  # try the host's next address
            connection.close()
            error = exc
    raise error


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (its date form is ignored)."""
    if value is None or not value.strip().isdigit():
        return None
    return min(float(value.strip()), MAX_RETRY_AFTER_SECONDS)
