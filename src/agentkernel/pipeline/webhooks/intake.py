"""The front's check of a chat request's ``webhook``, as an HTTP refusal every front sends alike."""

from __future__ import annotations

from agentkernel.core.config.webhooks import WebhooksConfig
from agentkernel.pipeline.webhooks.urls import WebhookRefused, check_url
from agentkernel.pipeline.wire.chat import ChatRequest, HTTPError


class WebhookCheck:
    """Refuses a turn whose webhook this deployment will not call, before it is queued.

    Args:
        config: the ``api.webhooks`` settings.
    """

    def __init__(self, config: WebhooksConfig) -> None:
        self.config = config

    async def check(self, chat: ChatRequest) -> None:
        """Pass a turn without a webhook or with one that may be called.

        Raises:
            HTTPError: 400 ``WEBHOOKS_DISABLED`` when no secret is configured (nothing is ever
                sent unsigned), 400 ``INVALID_WEBHOOK`` with a ``reason`` otherwise.
        """
        if chat.webhook is None:
            return
        if self.config.secret is None:
            raise HTTPError(
                400,
                "WEBHOOKS_DISABLED",
                "this server sends no webhooks (api.webhooks.secret is not set)",
                session_id=chat.session_id,
            )
        try:
            await check_url(chat.webhook, self.config)
        except WebhookRefused as exc:
            raise HTTPError(
                400, "INVALID_WEBHOOK", str(exc), reason=exc.reason, session_id=chat.session_id
            ) from exc
