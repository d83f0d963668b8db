"""One NATS client connection and the private event-loop thread all its calls run on.

nats-py is asyncio-only; a :class:`Connection` per server URL is shared by every transport and
consumer of the process (see :class:`~.transport.NatsTransport`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import nats

from agentkernel.core.errors import TransportError
from agentkernel.core.redact import redact_url
from agentkernel.pipeline.runtime.event_loop import LoopThread
from agentkernel.pipeline.transport.nats.errors import CLIENT_ERRORS

logger = logging.getLogger(__name__)

CLIENT_WARNING_INTERVAL_SECONDS = 10.0


class Connection:
    """One client connection and its private event-loop thread.

    Raises:
        TransportError: the server was not reached within ``connect_timeout`` seconds (the
            message names the URL and the last connection error).
    """

    def __init__(self, url: str, timeout: float, connect_timeout: float) -> None:
        self.loop = LoopThread(f"nats-{redact_url(url)}")
        self.last_error: Exception | None = None
        try:
            self.nc: Any = self.loop.run(self._connect(url, timeout, connect_timeout))
        except TimeoutError as exc:
            self.loop.stop()
            reason = f": {redact_url(repr(self.last_error))}" if self.last_error else ""
            raise TransportError(
                f"execution.queues.nats.url: cannot reach the NATS server at {redact_url(url)} "
                f"within {connect_timeout:g}s (connect_timeout){reason}"
            ) from exc
        except BaseException:
            self.loop.stop()
            raise
        self.js: Any = self.nc.jetstream(timeout=timeout)

    async def _connect(self, url: str, timeout: float, within: float) -> Any:
        connecting = nats.connect(
            url,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            connect_timeout=min(timeout, within),
            error_cb=self._client_error,
        )
        return await asyncio.wait_for(connecting, within)  # cancelled on this loop, not leaked

    async def _client_error(self, exc: Exception) -> None:
        if not getattr(self, "nc", None):  # still connecting: the start-up error will say it
            self.last_error = exc
            return
        await _log_client_error(exc)

    def close(self) -> None:
        with contextlib.suppress(*CLIENT_ERRORS):
            self.loop.run(self.nc.close(), 5)
        with contextlib.suppress(*CLIENT_ERRORS):
            self.loop.run(_cancel_other_tasks(), 5)
        self.loop.stop()


async def _cancel_other_tasks() -> None:
    """End what consumers left running (inbox drains, give-backs) before the loop stops."""
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


_last_client_warning = [0.0]


async def _log_client_error(exc: Exception) -> None:
    """nats-py reports every failed reconnect here: warn at most every 10 s, else debug."""
    now = time.monotonic()
    quiet = now - _last_client_warning[0] < CLIENT_WARNING_INTERVAL_SECONDS
    if not quiet:
        _last_client_warning[0] = now
    level = logging.DEBUG if quiet else logging.WARNING
    logger.log(level, "NATS client error: %s", redact_url(repr(exc)))
