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
"""

from __future__ import annotations

import hmac
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentkernel.core.errors import AKConfigError
from agentkernel.core.extras import require_extra

if TYPE_CHECKING:
    from agentkernel.core.config import JwtConfig

__all__ = ["ApiKeyValidator", "AuthValidator", "JwtValidator", "ValidationResult"]


@dataclass(frozen=True)
class ValidationResult:
    """The verdict on a token.

    Attributes:
        is_valid: whether the token is accepted.
        claims: what the token says about its holder (``sub`` is used as the user id).
        error_msg: why a token was refused (sent to the client: keep secrets out of it).
    """

    is_valid: bool
    claims: dict[str, Any] | None = field(default=None)
    error_msg: str | None = None

    @property
    def user_id(self) -> str | None:
        """The ``sub`` claim, when there is one."""
        sub = (self.claims or {}).get("sub")
        return None if sub is None else str(sub)


class AuthValidator(ABC):
    """Decides whether a token is valid. Called once per connection or request."""

    @abstractmethod
    def validate(self, token: str) -> ValidationResult:
        """Check ``token``; must not raise for a bad token (return ``is_valid=False``)."""


class ApiKeyValidator(AuthValidator):
    """Accepts the configured API keys (compared in constant time).

    Args:
        keys: user id -> key.
    """

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
            return ValidationResult(False, error_msg=f"invalid token: {type(exc).__name__}")
        user = claims.get(config.user_claim)
        if user is None:
            return ValidationResult(
                False, error_msg=f"the token has no '{config.user_claim}' claim"
            )
        return ValidationResult(True, claims=claims | {"sub": str(user)})


def _read(path: str, key: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise AKConfigError(f"{key}: cannot read '{path}': {exc}") from exc
