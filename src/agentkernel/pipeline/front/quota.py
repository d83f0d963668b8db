"""The chat front's side of the per-identity caps (see :mod:`agentkernel.pipeline.quota`): refuse
a turn past a cap with 429, and note when a reply reached its caller."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from agentkernel.core.config.limits import LimitsConfig
from agentkernel.core.errors import AKConfigError, StoreError
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.quota import Quota, retry_after
from agentkernel.pipeline.response_store.base import ResponseStore
from agentkernel.pipeline.wire.chat import HTTPError
from agentkernel.pipeline.wire.records import ResponseRecord

__all__ = ["IdentityQuota"]

logger = logging.getLogger(__name__)


class IdentityQuota:
    """Per-identity caps of one front over the ledger of its response store.

    Raises:
        AKConfigError: ``identity_unread_turns`` is over what the store's ledger can hold.
    """

    def __init__(self, store: ResponseStore, limits: LimitsConfig) -> None:
        self.quota = Quota(limits.identity_unread_turns, limits.identity_reply_bytes)
        self.ledger = None if self.quota.off else store.quota_ledger()
        self._log = RateLimitedLog(logger)
        bound = None if self.ledger is None else self.ledger.max_unread_turns
        if bound is not None and (self.quota.unread_turns or 0) > bound:
            raise AKConfigError(
                f"api.limits.identity_unread_turns: at most {bound} with "
                f"{type(store).__name__} (got {self.quota.unread_turns})"
            )

    def counts(self, owner: str | None) -> bool:
        """Whether turns of ``owner`` are counted (a cap is on and the turn has an identity)."""
        return self.ledger is not None and owner is not None

    def admit(self, owner: str | None, request_id: str, session_id: str) -> None:
        """Count the turn as unread for ``owner`` (blocking).

        Raises:
            HTTPError: 429 ``QUOTA_EXCEEDED`` with ``Retry-After`` past a cap.
        """
        if self.ledger is None or owner is None:  # counts(owner), spelled out for the type checker
            return
        try:
            wait = self.ledger.admit(owner, request_id, self.quota)
        except StoreError as exc:
            self._failed("admit", exc)
            return
        if wait is not None:
            raise HTTPError(
                429,
                "QUOTA_EXCEEDED",
                f"this identity holds its limit of {self.quota.unread_turns} unread turns or "
                f"{self.quota.reply_bytes} bytes of stored replies; read the replies it has, or "
                "retry later",
                {"Retry-After": str(retry_after(wait))},
                session_id=session_id,
            )

    def read(self, record: ResponseRecord) -> None:
        """``record`` reached its caller (it was visible to them): no longer unread."""
        if self.ledger is None or record.owner is None:
            return
        try:
            self.ledger.read(record.owner, record.request_id)
        except StoreError as exc:
            self._failed("read", exc)

    async def reading(
        self, frames: AsyncIterator[dict[str, Any] | None], owner: str | None, request_id: str
    ) -> AsyncIterator[dict[str, Any] | None]:
        """``frames`` of a stream; its turn is read once the final frame went out."""
        async for frame in frames:
            yield frame
            if frame is not None and frame.get("done") and owner is not None:
                await asyncio.to_thread(self.read, ResponseRecord(request_id, "", 200, owner=owner))

    def _failed(self, step: str, exc: StoreError) -> None:
        self._log.log(
            logging.WARNING, f"quota:{step}", "per-identity quota not counted (%s): %s", step, exc
        )
