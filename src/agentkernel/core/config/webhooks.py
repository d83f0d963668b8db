"""The configuration model of completion webhooks (``api.webhooks``).

Webhooks are off until a ``secret`` is set and ``allowed_hosts`` names the receivers: a request
carrying ``webhook`` is refused before that. Durations are float seconds.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import Field, SecretStr, StringConstraints, field_validator

from agentkernel.core.config.base import Block

#: An ``allowed_hosts`` entry: ``*``, a host name or IP literal, or ``*.`` and a domain.
HostPattern = Annotated[
    str,
    StringConstraints(
        strip_whitespace=True, to_lower=True, min_length=1, max_length=253, pattern=r"^\S+$"
    ),
]
_PATTERN = re.compile(r"^(\*|(\*\.)?[a-z0-9_.:\[\]-]+)$")


class WebhooksConfig(Block):
    """``api.webhooks``: where and how the final reply of a turn is POSTed (see
    docs/turn-control.md, "Completion webhooks")."""

    secret: SecretStr | None = Field(
        None,
        description="Key of the HMAC-SHA256 signature every webhook carries; give the IO "
        "processes and the response handlers the same one. Unset: webhooks are off and a chat "
        "request carrying 'webhook' is answered 400 WEBHOOKS_DISABLED (never sent unsigned).",
    )
    allowed_hosts: list[HostPattern] = Field(
        default_factory=list,
        description="Hosts a webhook URL may name: '*' (any host), an exact host name or IP "
        "literal, or '*.example.com' (any name under example.com, not example.com itself). "
        "Empty: none. Whatever matches, an address that is not public (loopback, private, "
        "link-local, multicast, reserved, unspecified) is refused unless allowed_networks "
        "holds it.",
    )
    allowed_networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = Field(
        default_factory=list,
        description="Networks (CIDR, e.g. '10.20.0.0/16') whose addresses a webhook may reach "
        "although they are not public: an internal receiver. Empty: public addresses only.",
    )
    allow_http_loopback: bool = Field(
        False,
        description="Development switch: also accept http:// webhook URLs, and loopback "
        "addresses, when the host is or resolves to loopback only (127.0.0.0/8, ::1). "
        "Never on in production.",
    )
    max_delivery_seconds: float = Field(
        180.0,
        gt=0,
        le=3600,
        description="Seconds after the reply was stored during which a failed webhook is tried "
        "again (connection errors, timeouts, 5xx, 429); no attempt starts later.",
    )
    retry_delay: float = Field(
        1.0,
        gt=0,
        description="Seconds before the first retry; each later one waits twice as long (at "
        "most 60 s), with random jitter.",
    )
    connect_timeout: float = Field(
        3.0, gt=0, description="Seconds to connect (and finish TLS) to a webhook receiver."
    )
    read_timeout: float = Field(
        10.0, gt=0, description="Seconds to wait for each read of the receiver's answer."
    )
    max_concurrent: int = Field(
        4, ge=1, le=256, description="Webhooks one process sends at once (threads)."
    )
    max_pending: int = Field(
        1000,
        ge=1,
        description="Webhooks one process holds (sending or waiting to be retried); one more "
        "is dropped, logged and counted (outcome 'dropped').",
    )

    @field_validator("allowed_hosts")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if not _PATTERN.match(pattern) or pattern.count("*") > 1:
                raise ValueError(
                    f"{pattern!r} is not a host pattern ('*', 'host.example', '*.example.com')"
                )
        return patterns
