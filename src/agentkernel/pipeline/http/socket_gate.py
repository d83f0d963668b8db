"""How many ``/ws`` connections one IO process holds open (``api.limits.ws_connections``,
``api.limits.ws_connections_per_identity``).

An idle WebSocket costs the process about 65 KB, and nothing else bounds how many a client may
open. A handshake past either cap is refused before it is accepted: HTTP 429 with
``Retry-After`` where the server can answer a handshake with a response, close code 1013 (try
again later) where it cannot. The counts are per process (a socket lives in one process);
identities are compared as opaque strings, and with authentication off only the process cap
applies.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator

from fastapi import WebSocket
from fastapi.responses import JSONResponse

from agentkernel.core.config.limits import LimitsConfig
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.runtime.metrics import METRICS

__all__ = ["SocketGate"]

logger = logging.getLogger(__name__)

#: Seconds a refused client is told to wait before it tries again.
RETRY_AFTER_SECONDS = 5


class SocketGate:
    """Counts the open sockets of one process; used on the server's event loop only."""

    def __init__(self, limits: LimitsConfig) -> None:
        self.limits = limits
        self.open = 0
        self._per_identity: Counter[str] = Counter()
        self._log = RateLimitedLog(logger)

    @contextlib.asynccontextmanager
    async def slot(self, websocket: WebSocket, identity: str | None) -> AsyncIterator[bool]:
        """Hold one connection's place while the body runs; yields ``False`` (after refusing
        the handshake) when a cap is reached."""
        refusal = self._refusal(identity)
        if refusal is not None:
            await _refuse(websocket, refusal)
            yield False
            return
        self._take(identity)
        try:
            yield True
        finally:
            self._give(identity)

    def _refusal(self, identity: str | None) -> str | None:
        if self.open >= self.limits.ws_connections:
            reason = f"this server holds its limit of {self.limits.ws_connections} WebSockets"
        elif (
            identity is not None
            and self._per_identity[identity] >= self.limits.ws_connections_per_identity
        ):
            cap = self.limits.ws_connections_per_identity
            reason = f"at most {cap} WebSockets per identity may be open on this server"
        else:
            return None
        METRICS.inc("agentkernel_ws_refused_total")
        self._log.log(logging.WARNING, "ws-cap", "refused a WebSocket handshake: %s", reason)
        return reason

    def _take(self, identity: str | None) -> None:
        self.open += 1
        if identity is not None:
            self._per_identity[identity] += 1

    def _give(self, identity: str | None) -> None:
        self.open -= 1
        if identity is not None:
            self._per_identity[identity] -= 1
            if self._per_identity[identity] <= 0:
                del self._per_identity[identity]


async def _refuse(websocket: WebSocket, reason: str) -> None:
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        doc = {"error": "TOO_MANY_CONNECTIONS", "message": reason}
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        await websocket.send_denial_response(JSONResponse(doc, 429, headers))
        return
    await websocket.close(code=1013, reason="too many connections")
