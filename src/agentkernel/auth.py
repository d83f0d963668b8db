"""Pluggable authentication: validate a client's token and say who it is.

Implement :class:`AuthValidator` for your scheme and hand it to the WebSocket connection handler
(``WebsocketConnectionHandler.set_auth_validator(MyValidator())``)::

    class StaticTokens(AuthValidator):
        def validate(self, token: str) -> ValidationResult:
            user = TOKENS.get(token)
            if user is None:
                return ValidationResult(False, error_msg="unknown token")
            return ValidationResult(True, claims={"sub": user})
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AuthValidator", "ValidationResult"]


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
