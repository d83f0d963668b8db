"""The ``/ws`` subprotocols: the versioned one the server selects, and a credential beside it.

A browser cannot set a header on a WebSocket handshake, but it can offer subprotocols
(``new WebSocket(url, [...])`` sends them as ``Sec-WebSocket-Protocol``). A client that has a
credential offers two:

- :data:`PROTOCOL` (``agentkernel.v1``), the protocol the server selects;
- ``agentkernel.auth.key.<k>`` for an API key, or ``agentkernel.auth.bearer.<t>`` for a bearer
  token, where ``<k>``/``<t>`` is the credential's UTF-8 bytes in base64url without padding
  (RFC 4648 section 5), which keeps every credential a valid header token.

The kind is spelled out because the two are checked differently (a key against
``api.auth.api_keys``, a token as a JWT or by the validator), exactly as ``X-API-Key`` and
``Authorization: Bearer`` are. The server answers selecting only :data:`PROTOCOL`, so the
credential is never echoed. Anything else about the credential protocols (more than one, an
unknown kind, text that is not canonical base64url, a header over :data:`MAX_HEADER_BYTES`, no
:data:`PROTOCOL` beside it) raises :class:`SubprotocolError`; its message never repeats the
credential.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

#: The subprotocol of the chat WebSocket, the only one the server ever selects.
PROTOCOL = "agentkernel.v1"
#: Every credential subprotocol starts with this.
AUTH_PREFIX = "agentkernel.auth."
#: Largest ``Sec-WebSocket-Protocol`` (all its values together) the server reads, in bytes: room
#: for a bearer token of about 4.5 KB, well under the server's limit on a whole head.
MAX_HEADER_BYTES = 6144

Kind = Literal["key", "bearer"]
_KINDS: tuple[Kind, ...] = ("key", "bearer")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class SubprotocolError(ValueError):
    """The credential subprotocols cannot be read; the message is safe to show the client."""


@dataclass(frozen=True)
class OfferedCredential:
    """A credential a client offered as a subprotocol.

    Attributes:
        kind: ``"key"`` (checked as ``X-API-Key``) or ``"bearer"`` (as ``Authorization:
            Bearer``).
        secret: the credential itself.
    """

    kind: Kind
    secret: str

    def __repr__(self) -> str:  # never the secret, should one be printed by accident
        return f"OfferedCredential(kind={self.kind!r}, secret='***')"


def encode(kind: Kind, secret: str) -> str:
    """The subprotocol that carries ``secret`` as a credential of ``kind``."""
    text = base64.urlsafe_b64encode(secret.encode("utf-8")).decode("ascii").rstrip("=")
    return f"{AUTH_PREFIX}{kind}.{text}"


def offered(headers: Iterable[tuple[bytes, bytes]]) -> list[str]:
    """The subprotocols of a handshake's raw ASGI headers, in order (every
    ``Sec-WebSocket-Protocol`` header, split at commas).

    Raises:
        SubprotocolError: the headers together are over :data:`MAX_HEADER_BYTES`.
    """
    values = [v for k, v in headers if k.lower() == b"sec-websocket-protocol"]
    if sum(len(v) for v in values) > MAX_HEADER_BYTES:
        raise SubprotocolError(f"Sec-WebSocket-Protocol is over {MAX_HEADER_BYTES} bytes")
    names = (name.strip() for v in values for name in v.decode("latin-1").split(","))
    return [name for name in names if name]


def credential_of(protocols: list[str]) -> OfferedCredential | None:
    """The credential among ``protocols`` (``None``: none is offered).

    Raises:
        SubprotocolError: more than one credential, an unknown kind, text that is not
            canonical base64url of UTF-8 without control characters, or no :data:`PROTOCOL`.
    """
    carried = [p for p in protocols if p.startswith(AUTH_PREFIX)]
    if not carried:
        return None
    if len(carried) > 1:
        raise SubprotocolError("the handshake offers more than one credential subprotocol")
    if PROTOCOL not in protocols:
        raise SubprotocolError(f"a credential subprotocol needs {PROTOCOL} offered beside it")
    kind, _, text = carried[0].removeprefix(AUTH_PREFIX).partition(".")
    if kind not in _KINDS:
        raise SubprotocolError(f"the credential subprotocol's kind is not one of {_KINDS}")
    secret = _decode(text)
    return OfferedCredential(kind, secret)


def selected(protocols: list[str]) -> str | None:
    """The subprotocol the server answers with: :data:`PROTOCOL` when offered, else none."""
    return PROTOCOL if PROTOCOL in protocols else None


def _decode(text: str) -> str:
    """The credential of base64url ``text``; only the canonical spelling of each credential is
    accepted (no padding, no stray bits), so one credential has exactly one subprotocol."""
    malformed = SubprotocolError("the credential subprotocol is not base64url of a credential")
    if not _BASE64URL.fullmatch(text) or len(text) % 4 == 1:
        raise malformed
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        secret = raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise malformed from exc
    if _CONTROL.search(secret) or encode("key", secret) != f"{AUTH_PREFIX}key.{text}":
        raise malformed
    return secret
