"""The ``api.auth`` and ``api.websocket`` blocks of the configuration (see :mod:`.config`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from agentkernel.core.config.base import Block


class WebSocketConfig(Block):
    """``api.websocket``: serverless WebSocket connections (API Gateway)."""

    connections_table: str | None = Field(
        None,
        description="DynamoDB table of open WebSocket connections (hash key connection_id, TTL "
        "attribute expiry_time), written by the connection handler Lambda.",
    )
    connection_ttl: float = Field(
        7200.0,
        gt=0,
        description="Seconds a connection record lives (API Gateway closes "
        "connections after 2 hours).",
    )


class ApiKeyConfig(Block):
    """One API key and the identity it stands for."""

    user: str = Field(min_length=1, description="User id the key authenticates as.")
    key: SecretStr = Field(description="The key clients send (keep it out of committed files).")


JwtAlgorithm = Literal["HS256", "RS256", "ES256"]


def _hs256() -> list[JwtAlgorithm]:
    return ["HS256"]


class JwtConfig(Block):
    """``api.auth.jwt``: bearer tokens signed with a shared secret or a key pair."""

    algorithms: list[JwtAlgorithm] = Field(
        default_factory=_hs256, description="Accepted signature algorithms."
    )
    secret: SecretStr | None = Field(None, description="HS256 shared secret.")
    public_key_file: str | None = Field(None, description="PEM public key file (RS256/ES256).")
    jwks_file: str | None = Field(
        None, description="JWKS file with the public keys (RS256/ES256), chosen by the 'kid'."
    )
    audience: str | None = Field(None, description="Required 'aud' claim.")
    issuer: str | None = Field(None, description="Required 'iss' claim.")
    user_claim: str = Field("sub", description="Claim holding the user id.")
    leeway: float = Field(0.0, ge=0, description="Seconds of clock skew allowed for 'exp'.")


class AuthConfig(Block):
    """``api.auth``: who may call the API (off by default)."""

    enabled: bool = Field(
        False,
        description="Require a valid API key or bearer token on every route except /health and "
        "/ready, and on the /ws handshake; a session then belongs to the identity that "
        "created it.",
    )
    api_keys: list[ApiKeyConfig] = Field(
        default_factory=list, description="Accepted API keys (header X-API-Key)."
    )
    jwt: JwtConfig | None = Field(None, description="Bearer JWT validation.")
    validator: str | None = Field(
        None,
        description="Dotted path to an agentkernel.auth.AuthValidator subclass (built without "
        "arguments) that checks bearer tokens instead of the JWT settings.",
    )
    aliases: dict[str, str] = Field(
        default_factory=dict,
        description="Identities to treat as another one on purpose, e.g. "
        "{'jwt:https%3A//idp.example/:alice': 'key:alice'}: a caller authenticated as a key "
        "is served as its value (its sessions, its replies). Identities are '<scheme>:<user>' "
        "or '<scheme>:<issuer>:<user>' (see docs/authentication.md).",
    )
