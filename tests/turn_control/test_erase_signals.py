"""Erasing a session through the sessions API uses the configured turn-signal settings."""

from __future__ import annotations

import asyncio

from agentkernel.core.config.root import AKConfig
from agentkernel.pipeline.front.chat_front import ChatFront
from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.transport.in_memory import InMemoryTransport


def test_an_erase_first_to_ask_for_the_signals_makes_them_with_the_configured_stale_after() -> None:
    config = AKConfig.load()
    control = config.execution.turn_control.model_copy(update={"stale_after": 123.0})
    config = config.model_copy(
        update={"execution": config.execution.model_copy(update={"turn_control": control})}
    )
    sessions = InMemorySessionStore()
    front = ChatFront(InMemoryTransport(), InMemoryResponseStore(), config, sessions=sessions)

    answer = asyncio.run(front.session_ops.delete("s-1", None))

    assert answer.status == 204
    signals = sessions.turn_signals()  # made once: by the erase above
    assert signals is not None and signals.stale_after == 123.0
