"""Pluggable authentication: validate a client's token and say who it is.

Built in: :class:`ApiKeyValidator` and :class:`JwtValidator` (HS256 secret, or RS256/ES256 public
key or JWKS file; ``exp``, ``aud`` and ``iss`` checked), configured under ``api.auth``. For another
scheme implement :class:`AuthValidator` and name it in ``api.auth.validator``, or hand it to the
serverless WebSocket connection handler (``WebsocketConnectionHandler.set_auth_validator(v)``)::

    class StaticTokens(AuthValidator):
        def validate(self, token: str) -> ValidationResult:
            user = TOKENS.get(token)
            if user is None:
                return ValidationResult(False, error_msg="unknown token")
            return ValidationResult(True, claims={"sub": user})

An identity names its scheme (and issuer), so two schemes never share a namespace: API key user
``alice`` is ``key:alice``, a JWT with ``sub`` ``alice`` from ``https://idp/`` is
``jwt:https%3A//idp/:alice``, a custom validator's ``alice`` is ``token:alice``
(:func:`qualified_identity`). ``api.auth.aliases`` maps one identity onto another on purpose.
"""

from __future__ import annotations

import hmac
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

from agentkernel.core.errors import AKConfigError
from agentkernel.core.extras import require_extra

if TYPE_CHECKING:
    from agentkernel.core.config.auth import JwtConfig

__all__ = [
    "ApiKeyValidator",
    "AuthValidator",
    "JwtValidator",
    "ValidationResult",
    "alias",
    "qualified_identity",
]

# Kept as they are in an identity; ':' and '%' are always escaped, so parts never run together.
_SAFE = "/@.-_~"


def alias(aliases: Mapping[str, str], identity: str | None) -> str | None:
    """``identity`` as ``api.auth.aliases`` maps it (every front applies this one rule)."""
    return None if identity is None else aliases.get(identity, identity)


def qualified_identity(scheme: str, user: str, issuer: str | None = None) -> str:
    """The identity of ``user`` as ``scheme`` (and ``issuer``, when the credential names one)
    authenticated it: ``<scheme>:<user>`` or ``<scheme>:<issuer>:<user>``, with ``:`` and ``%``
    escaped in the parts, so different schemes or issuers never give the same identity."""
    parts = [quote(issuer, safe=_SAFE)] if issuer else []
    return ":".join([scheme, *parts, quote(user, safe=_SAFE)])


@dataclass(frozen=True)
class ValidationResult:
    """The verdict on a token.

    Attributes:
        is_valid: whether the token is accepted.
        claims: what the token says about its holder (``sub`` is the user id; upstream's
            ``userId`` claim is read when there is no ``sub``).
        error_msg: why a token was refused (sent to the client: keep secrets out of it).
        subject: the user id when the claims name none (upstream's field). Unlike upstream it
            has no default: a validator that names no user gets no identity, never a shared one.
    """

    is_valid: bool
    claims: dict[str, Any] | None = field(default=None)
    error_msg: str | None = None
    subject: str | None = None

    @property
    def user_id(self) -> str | None:
        """The ``sub`` claim, else the ``userId`` claim, else :attr:`subject`."""
        claims = self.claims or {}
        for user in (claims.get("sub"), claims.get("userId"), self.subject):
            if user is not None:
                return str(user)
        return None

    @property
    def expires_at(self) -> float | None:
        """When the credential stops being valid (Unix seconds, the ``exp`` claim), if it says."""
        exp = (self.claims or {}).get("exp")
        if isinstance(exp, bool) or not isinstance(exp, (int, float)) or not math.isfinite(exp):
            return None
        return float(exp)

    def identity(self, scheme: str) -> str | None:
        """The caller's identity under ``scheme`` (see :func:`qualified_identity`): the user id,
        qualified by the ``iss`` claim when there is one."""
        user = self.user_id
        if user is None:
            return None
        issuer = (self.claims or {}).get("iss")
        return qualified_identity(scheme, user, str(issuer) if issuer else None)


class AuthValidator(ABC):
    """Decides whether a token is valid. Called once per connection or request.

    ``scheme`` names the namespace of the identities it vouches for (``token`` unless a subclass
    says otherwise): a subclass that sets ``scheme = "jwt"`` shares the JWT namespace on purpose.
    """

    scheme: ClassVar[str] = "token"

    @abstractmethod
    def validate(self, token: str) -> ValidationResult:
        """Check ``token``; must not raise for a bad token (return ``is_valid=False``)."""


class ApiKeyValidator(AuthValidator):
    """Accepts the configured API keys (compared in constant time).

    Args:
        keys: user id -> key.
    """

    scheme: ClassVar[str] = "key"

    def __init__(self, keys: dict[str, str]) -> None:
        self._keys = [(user, key.encode()) for user, key in keys.items()]

    def validate(self, token: str) -> ValidationResult:
        given = token.encode()
        user = None
        for candidate, key in self._keys:  # every key is compared, so timing says nothing
            if hmac.compare_digest(given, key):
                user = candidate
        if user is None:
            return ValidationResult(False, error_msg="unknown API key")
        return ValidationResult(True, claims={"sub": user})


class JwtValidator(AuthValidator):
    """Checks a JWT's signature, ``exp``, and (when configured) ``aud`` and ``iss``.

    Args:
        config: ``api.auth.jwt``.

    Raises:
        AKConfigError: no key to check signatures with, or an unreadable key file.
        ImportError: the ``auth`` extra (PyJWT) is not installed.
    """

    scheme: ClassVar[str] = "jwt"

    def __init__(self, config: JwtConfig) -> None:
        with require_extra("auth", "api.auth.jwt"):
            import jwt
        self._jwt = jwt
        self._config = config
        self._key: Any = None
        self._jwks: Any = None
        if config.secret is not None:
            self._key = config.secret.get_secret_value()
        elif config.public_key_file:
            self._key = _read(config.public_key_file, "api.auth.jwt.public_key_file")
        elif config.jwks_file:
            text = _read(config.jwks_file, "api.auth.jwt.jwks_file")
            self._jwks = jwt.PyJWKSet.from_json(text)
        else:
            raise AKConfigError(
                "api.auth.jwt: set secret (HS256), public_key_file or jwks_file (RS256/ES256)"
            )

    def validate(self, token: str) -> ValidationResult:
        jwt, config = self._jwt, self._config
        try:
            key = (
                self._key
                if self._jwks is None
                else self._jwks[jwt.get_unverified_header(token)["kid"]]
            )
            claims = jwt.decode(
                token,
                key,
                algorithms=list(config.algorithms),
                audience=config.audience,
                issuer=config.issuer,
                leeway=config.leeway,
                options={"require": ["exp"], "verify_aud": config.audience is not None},
            )
        except (jwt.PyJWTError, KeyError, ValueError) as exc:
            return ValidationResult(False, error_msg=self._refusal(exc))
        user = claims.get(config.user_claim)
        if user is None:
            return ValidationResult(
                False, error_msg=f"the token has no '{config.user_claim}' claim"
            )
        return ValidationResult(True, claims=claims | {"sub": str(user)})

    def _refusal(self, exc: Exception) -> str:
        """What was wrong with a refused token, in words a caller can act on."""
        jwt = self._jwt
        if isinstance(exc, jwt.MissingRequiredClaimError):
            return f"the token has no '{exc.claim}' claim"
        if isinstance(exc, KeyError):
            return "the token's key id (kid) is not in the configured key set"
        refusals: list[tuple[type[Exception], str]] = [
            (jwt.ExpiredSignatureError, "the token has expired"),
            (
                jwt.ImmatureSignatureError,
                "the token is not valid yet (nbf or iat is in the future)",
            ),
            (jwt.InvalidAudienceError, "the token's audience (aud) is not the configured one"),
            (jwt.InvalidIssuerError, "the token's issuer (iss) is not the configured one"),
            (jwt.InvalidSignatureError, "the token's signature does not verify"),
            (
                jwt.InvalidAlgorithmError,
                "the token is signed with an algorithm that is not accepted",
            ),
        ]
        for kind, message in refusals:
            if isinstance(exc, kind):
                return message
        return "the token is not a well-formed JWT"


def _read(path: str, key: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise AKConfigError(f"{key}: cannot read '{path}': {exc}") from exc
