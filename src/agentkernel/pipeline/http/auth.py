"""Authentication of the HTTP API and the ``/ws`` handshake (``api.auth``).

An ASGI middleware checks every request except ``/health`` and ``/ready``: an ``X-API-Key``
header against ``api.auth.api_keys``, or an ``Authorization: Bearer`` token (the WebSocket
handshake may pass it as ``?token=``) against the JWT settings or a custom validator. A browser's
WebSocket handshake may offer either one as a subprotocol instead (:mod:`.subprotocols`), checked
as the header it stands for; one that disagrees with another credential of the same handshake is
refused. A missing or refused credential answers 401 with ``WWW-Authenticate``, the WebSocket
handshake included (``?token=`` and subprotocols are read on the handshake only, never on plain
HTTP routes). The caller's identity (its scheme, issuer and user id: ``key:alice``,
``jwt:<issuer>:alice``; see :func:`agentkernel.auth.qualified_identity`, mapped through
``api.auth.aliases``) is then available to the routes as :data:`IDENTITY`, and when the
credential expires as :data:`EXPIRES_AT` (the WebSocket closes then). Tokens and keys are never
logged, and a user id with control characters is refused.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from agentkernel.auth import ApiKeyValidator, AuthValidator, JwtValidator, alias
from agentkernel.core.config.auth import AuthConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.core.extras import resolve_dotted
from agentkernel.core.redact import printable
from agentkernel.pipeline.http import subprotocols
from agentkernel.pipeline.http.access_log import SCOPE_USER

logger = logging.getLogger(__name__)

#: The authenticated identity of the request being served (``None`` when auth is off).
IDENTITY: ContextVar[str | None] = ContextVar("agentkernel_identity", default=None)
#: When the request's credential expires, in Unix seconds (``None``: it does not say).
EXPIRES_AT: ContextVar[float | None] = ContextVar("agentkernel_expires_at", default=None)
OPEN_PATHS = frozenset({"/health", "/ready"})
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Unauthorized(Exception):
    """No credential (``missing``), or one that was refused; the message is safe to show the
    client."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


@dataclass(frozen=True)
class Credential:
    """Who a valid credential authenticated, and until when.

    Attributes:
        identity: the qualified identity (``key:alice``, ``jwt:<issuer>:alice``), after aliases.
        user: the bare user id the credential named (for log lines).
        expires_at: Unix seconds after which the credential is refused (its ``exp`` plus the
            configured leeway), or ``None`` for a credential without expiry (an API key).
    """

    identity: str
    user: str
    expires_at: float | None = None


class Authenticator:
    """Turns a request's credentials into a :class:`Credential`.

    Args:
        config: ``api.auth``.
        validator: checks bearer tokens instead of ``api.auth.validator`` or the JWT settings
            (a validator instance handed to ``ECSIOHandler.run(auth_validator=...)``).

    Raises:
        AKConfigError: auth is enabled without any way to check a credential.
    """

    def __init__(self, config: AuthConfig, validator: AuthValidator | None = None) -> None:
        keys = {k.user: k.key.get_secret_value() for k in config.api_keys}
        self._api_keys = ApiKeyValidator(keys) if keys else None
        self._bearer: AuthValidator | None = self._api_keys
        if validator is not None:
            self._bearer = validator
        elif config.validator:
            self._bearer = resolve_dotted(config.validator, AuthValidator, "api.auth.validator")()
        elif config.jwt is not None:
            self._bearer = JwtValidator(config.jwt)
        if self._bearer is None:
            raise AKConfigError("api.auth: enabled, but no api_keys, jwt or validator is set")
        self._aliases = dict(config.aliases)
        self._leeway = config.jwt.leeway if config.jwt is not None else 0.0

    def authenticate(self, headers: dict[str, str], query: dict[str, str]) -> Credential:
        """The credential of the request, checked.

        Raises:
            Unauthorized: none was given, or it was refused.
        """
        if (key := headers.get("x-api-key")) is not None and self._api_keys is not None:
            return self._check(self._api_keys, key)
        scheme, _, token = headers.get("authorization", "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else query.get("token", "")
        if not token:
            raise Unauthorized("a bearer token or an API key is required", missing=True)
        return self._check(self._bearer, token)  # type: ignore[arg-type]

    def _check(self, validator: AuthValidator, token: str) -> Credential:
        result = validator.validate(token)
        user, identity = result.user_id, result.identity(validator.scheme)
        if not result.is_valid or user is None or identity is None:
            raise Unauthorized(result.error_msg or "invalid credentials")
        if not user or _CONTROL.search(user):
            raise Unauthorized("the credential's user id is empty or has control characters")
        expires = result.expires_at
        if expires is not None and isinstance(validator, JwtValidator):
            expires += self._leeway  # accepted until then, on the socket as on a request
        return Credential(alias(self._aliases, identity) or identity, user, expires)


class AuthMiddleware:
    """ASGI middleware enforcing :class:`Authenticator` on every route but the open ones."""

    def __init__(
        self, app: ASGIApp, authenticator: Authenticator, open_paths: frozenset[str] = OPEN_PATHS
    ) -> None:
        self.app, self.authenticator, self.open_paths = app, authenticator, open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query: dict[str, str] = {}
        if scope["type"] == "websocket":  # browsers cannot set headers on a WebSocket handshake
            raw = scope.get("query_string", b"").decode("latin-1")
            query = {k: v[0] for k, v in parse_qs(raw).items()}
        try:
            if scope["type"] == "websocket":
                headers = _with_subprotocol_credential(scope, headers, query)
            credential = self.authenticator.authenticate(headers, query)
        except Unauthorized as exc:
            logger.info("refused %s %s: %s", scope["type"], printable(scope["path"]), exc)
            await _refuse(scope, receive, send, exc)
            return
        scope[SCOPE_USER] = credential.user  # for the access log, which wraps this middleware
        token = IDENTITY.set(credential.identity)
        expiry = EXPIRES_AT.set(credential.expires_at)
        try:
            await self.app(scope, receive, send)
        finally:
            EXPIRES_AT.reset(expiry)
            IDENTITY.reset(token)


def _with_subprotocol_credential(
    scope: Scope, headers: dict[str, str], query: dict[str, str]
) -> dict[str, str]:
    """``headers`` with the credential the handshake offers as a subprotocol set as the header
    of its kind (``X-API-Key`` or ``Authorization``), so it is checked exactly as that header.

    Raises:
        Unauthorized: the subprotocols cannot be read, or another credential of the handshake
            (a header or ``?token=``) is not the same one.
    """
    try:
        offered = subprotocols.credential_of(subprotocols.offered(scope["headers"]))
    except subprotocols.SubprotocolError as exc:
        raise Unauthorized(str(exc)) from exc
    if offered is None:
        return headers
    for source, other in _handshake_credentials(headers, query).items():
        if other != (offered.kind, offered.secret):
            message = f"the credential subprotocol and {source} are not the same credential"
            raise Unauthorized(message)
    if offered.kind == "key":
        return headers | {"x-api-key": offered.secret}
    return headers | {"authorization": f"Bearer {offered.secret}"}


def _handshake_credentials(
    headers: dict[str, str], query: dict[str, str]
) -> dict[str, tuple[str, str]]:
    """The credentials a handshake carries besides its subprotocols, as ``(kind, secret)`` by
    where they are (an ``Authorization`` scheme other than Bearer matches no subprotocol)."""
    found = {}
    if "x-api-key" in headers:
        found["X-API-Key"] = ("key", headers["x-api-key"])
    if "authorization" in headers:
        scheme, _, token = headers["authorization"].partition(" ")
        kind = "bearer" if scheme.lower() == "bearer" else f"scheme {scheme}"
        found["Authorization"] = (kind, token.strip())
    if "token" in query:
        found["?token="] = ("bearer", query["token"])
    return found


async def _refuse(scope: Scope, receive: Receive, send: Send, exc: Unauthorized) -> None:
    """401 with ``WWW-Authenticate`` and the JSON error; a WebSocket handshake gets the same
    answer where the server supports ASGI's denial response, else a close (HTTP 403)."""
    body = json.dumps({"error": "UNAUTHORIZED", "message": str(exc)}).encode()
    # RFC 6750 3.1: no error code when the request carried no credential at all
    challenge = 'Bearer realm="agentkernel"' + ("" if exc.missing else ', error="invalid_token"')
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", challenge.encode()),
    ]
    prefix = "http"
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008, "reason": "unauthorized"})
            return
        prefix = "websocket.http"
    await send({"type": f"{prefix}.response.start", "status": 401, "headers": headers})
    await send({"type": f"{prefix}.response.body", "body": body})
