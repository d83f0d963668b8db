"""The NATS transport through the sync face, as the NATS tests call it from their threads."""

from __future__ import annotations

from typing import Any

from agentkernel.pipeline.transport.nats import NatsTransport
from agentkernel.pipeline.transport.sync_face import SyncTransport


def nats(*args: Any) -> SyncTransport:
    """A :class:`NatsTransport` of ``args`` behind :class:`SyncTransport` (its consumers block)."""
    return SyncTransport(NatsTransport(*args))
