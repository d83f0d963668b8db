"""The configuration model of the HTTP server of the IO process (``api``).

All durations are float seconds.
"""

from __future__ import annotations

from pydantic import Field, SecretStr

from agentkernel.core.config.auth import AuthConfig, WebSocketConfig
from agentkernel.core.config.base import Block
from agentkernel.core.config.limits import LimitsConfig
from agentkernel.core.config.webhooks import WebhooksConfig


class ApiConfig(Block):
    """``api``: the HTTP server of the IO process."""

    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to listen on (0 = any free).")
    max_body_bytes: int = Field(
        1_048_576, ge=1, description="Largest accepted request body in bytes; larger is 413."
    )
    sync_timeout: float = Field(
        60.0, gt=0, description="Seconds a rest_sync request waits for its reply before 504."
    )
    enqueue_timeout: float = Field(
        5.0, gt=0, description="Seconds an enqueue may take before the request fails with 503."
    )
    body_timeout: float = Field(
        5.0,
        gt=0,
        description="Seconds a client may take to send a whole request body; a slower body is "
        "answered 408 and the connection closed.",
    )
    shutdown_timeout: float = Field(
        5.0,
        ge=0,
        description="Seconds a stopping IO process keeps waiting rest_sync requests open for "
        "their replies (after an embedded runner has drained); the rest are answered 503 "
        "SHUTTING_DOWN with the request_id and a Location to poll.",
    )
    stream_heartbeat: float = Field(
        15.0,
        gt=0,
        description="Seconds of silence after which a Server-Sent Events stream gets a "
        "keep-alive comment, so proxies do not close it.",
    )
    ws_max_turns: int = Field(
        32, ge=1, description="Turns one WebSocket connection may have open at once."
    )
    websocket: WebSocketConfig = Field(
        default_factory=WebSocketConfig, description="Serverless WebSocket connections."
    )
    auth: AuthConfig = Field(default_factory=AuthConfig, description="Authentication.")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Limits (429, 408).")
    webhooks: WebhooksConfig = Field(
        default_factory=WebhooksConfig, description="Completion webhooks (off without a secret)."
    )
    access_log: bool = Field(
        False,
        description="Log one line per request and WebSocket connection (logger "
        "agentkernel.access): client, method, path, status, milliseconds, request_id, user.",
    )
    playground: bool | None = Field(
        None,
        description="Serve the playground page at /playground (and redirect / to it): a small "
        "browser page to chat with the agents, watch replies stream and see the pipeline's "
        "metrics. The page and its two static files are public; every API call it makes sends "
        "the credential typed into it. Unset: on where the process runs the agents itself "
        "(agentkernel serve), off for an IO process alone (agentkernel io, ECSIOHandler).",
    )
    idempotency_secret: SecretStr | None = Field(
        None,
        description="Secret mixed into request ids derived from an Idempotency-Key, so nobody "
        "can compute another client's request id; give every IO process the same one. Unset: "
        "a random secret the response store keeps for the deployment.",
    )
