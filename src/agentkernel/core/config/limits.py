"""The configuration model of the API's limits (``api.limits``).

Every limit has a production default; ``null`` switches an optional one off. Durations are float
seconds, sizes bytes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentkernel.core.config.base import Block

#: Routes that ``api.limits.public_routes`` may open to callers without a credential.
PublicRoute = Literal["metrics", "docs"]


class LimitsConfig(Block):
    """``api.limits``: what one caller, one connection and one process may hold."""

    identity_unread_turns: int | None = Field(
        100,
        ge=1,
        description="Turns one identity may have accepted whose reply it has not read yet (a "
        "sync answer, a GET of the reply, a WebSocket reply or a finished stream reads it); one "
        "more is answered 429 with Retry-After. Counted across IO processes and Lambda containers "
        "when the response store is shared (redis, dynamodb; at most 5000 with dynamodb). null: "
        "no cap.",
    )
    identity_reply_bytes: int | None = Field(
        67_108_864,
        ge=1,
        description="Bytes of stored replies and stream chunks one identity may hold until "
        "their TTL ends; a new turn past it is answered 429 with Retry-After. null: no cap.",
    )
    ws_connections: int = Field(
        1000,
        ge=1,
        description="Open /ws connections per IO process; one more handshake is refused "
        "(HTTP 429, or close code 1013 where the server cannot answer a handshake).",
    )
    ws_connections_per_identity: int = Field(
        16,
        ge=1,
        description="Open /ws connections per identity per IO process (authentication on).",
    )
    header_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a client may take to send a request's line and headers (from the "
        "connection's start or the previous answer); a slower one is answered 408 and closed.",
    )
    max_header_bytes: int = Field(
        16_384,
        ge=1024,
        description="Largest request line plus headers, in bytes; a larger one is answered 431 "
        "and closed.",
    )
    public_routes: list[PublicRoute] = Field(
        default_factory=list,
        description="Routes served without a credential while authentication is on: 'metrics' "
        "(GET /metrics, for a scraper) and 'docs' (/docs and /openapi.json). The API itself "
        "still needs one.",
    )
