"""Request ids nobody can compute: fresh ones, or ones derived under the deployment's secret.

A turn sent without an ``Idempotency-Key`` (or, on a WebSocket, without a client id) gets a
random id. One sent with a key gets an HMAC of the caller's identity, the session and the key,
so a retry finds the same turn, on any IO process. The HMAC key is ``api.idempotency_secret``
when set, otherwise a random secret the response store keeps for the whole deployment
(:meth:`~agentkernel.pipeline.response_store.base.ResponseStore.shared_secret`), read once per
process: no default leaves ids computable from public values.
"""

from __future__ import annotations

import logging

from agentkernel.core.blocking import call
from agentkernel.core.config.api import ApiConfig
from agentkernel.core.errors import StoreError
from agentkernel.pipeline.front.answers import RETRY_AFTER_SECONDS
from agentkernel.pipeline.response_store.base import ResponseStore
from agentkernel.pipeline.wire.chat import HTTPError, check_idempotency_key, request_id_for

__all__ = ["RequestIds"]

logger = logging.getLogger(__name__)


class RequestIds:
    """Makes the request ids of one front.

    Args:
        api: the ``api`` settings (``idempotency_secret``).
        store: keeps the deployment's secret when none is configured.
    """

    def __init__(self, api: ApiConfig, store: ResponseStore) -> None:
        self.api, self.store = api, store
        self._secret: bytes | None = None

    async def request_id(
        self, session_id: str, key: str | None, owner: str | None
    ) -> tuple[str, bool]:
        """A fresh id (``True``), or the one ``key`` stands for in ``owner``'s session.

        Raises:
            HTTPError: 400 for an invalid key; 503 ``STORE_UNAVAILABLE`` when the deployment's
                secret cannot be read (nothing was enqueued: retry).
        """
        if key is None:
            return request_id_for(session_id, None, owner, b"")
        check_idempotency_key(key)
        return request_id_for(session_id, key, owner, await self.secret())

    async def secret(self) -> bytes:
        """The HMAC key of derived ids (raises like :meth:`request_id`)."""
        if self._secret is None:
            configured = self.api.idempotency_secret
            if configured is not None:
                self._secret = configured.get_secret_value().encode()
            else:
                self._secret = await self._shared_secret()
        return self._secret

    async def _shared_secret(self) -> bytes:
        store = self.store
        try:
            return await call(store.nonblocking, store.shared_secret)
        except StoreError as exc:
            logger.warning("cannot read the deployment secret from the response store: %s", exc)
            raise HTTPError(
                503,
                "STORE_UNAVAILABLE",
                "the reply store is unreachable; nothing was queued, retry",
                {"Retry-After": str(RETRY_AFTER_SECONDS)},
            ) from exc
