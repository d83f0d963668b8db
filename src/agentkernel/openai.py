"""OpenAI Agents SDK agents served by agentkernel (extra ``openai``).

::

    from agents import Agent, function_tool
    from agentkernel.openai import OpenAIModule

    @function_tool
    def add(a: int, b: int) -> int:
        return a + b

    billing = Agent(name="billing", instructions="Billing agent. Explain invoices.")
    triage = Agent(name="triage", instructions="Triage. Route the user.", tools=[add],
                   handoffs=[billing])
    OpenAIModule([triage, billing])

Each SDK agent is registered under its ``name`` (clients pick it with the ``agent`` field). A turn
runs the agent on the session's conversation: the SDK's ``Session`` interface is backed by a list
of items kept in the turn's state, which the Agent Runner commits together with the reply in the
session store. A later turn on any runner process sharing that store continues the
conversation; a failed turn leaves it as it was. Tools see the :class:`~agentkernel.Turn` as the
run context (``ctx.context``).

Streaming turns yield the text deltas of the SDK's streamed run. Model failures are mapped by
:func:`agentkernel.core.model_errors.model_failure` (rate limits and timeouts are retried, refused
requests and malformed responses answer ``AGENT_ERROR``), and every turn is bounded by
``timeout`` seconds.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from typing import Any, NoReturn

from agentkernel.core.agent import Agent, AgentRegistry, Module, Turn
from agentkernel.core.extras import require_extra
from agentkernel.core.model_errors import raise_model_failure, within

with require_extra("openai", "agentkernel.openai"):
    import agents as sdk
    from openai.types.responses import ResponseTextDeltaEvent

__all__ = ["HISTORY_KEY", "OpenAIAgent", "OpenAIModule", "OpenAIRunner", "TurnSession"]

#: Where the conversation's items are kept in ``turn.state``.
HISTORY_KEY = "openai_history"


class TurnSession:
    """The SDK's ``Session`` protocol over a list of items in the turn's state.

    Args:
        session_id: the agentkernel session id.
        items: the list to read and extend (``turn.state[HISTORY_KEY]``).
        max_items: keep at most this many items; older ones are dropped a whole exchange at a
            time (the kept history starts with a user message).
    """

    session_settings = None

    def __init__(self, session_id: str, items: list[Any], max_items: int | None = None) -> None:
        self.session_id = session_id
        self._items = items
        self._max_items = max_items

    async def get_items(self, limit: int | None = None) -> list[Any]:
        items = self._items if limit is None else self._items[-limit:] if limit > 0 else []
        return copy.deepcopy(items)

    async def add_items(self, items: list[Any]) -> None:
        # Through JSON, as the session store keeps it: a non-serialisable item fails here.
        self._items.extend(json.loads(json.dumps(items)))
        self._trim()

    async def pop_item(self) -> Any:
        return self._items.pop() if self._items else None

    async def clear_session(self) -> None:
        self._items.clear()

    def _trim(self) -> None:
        if self._max_items is None or len(self._items) <= self._max_items:
            return
        start = len(self._items) - self._max_items
        users = [i for i, item in enumerate(self._items) if item.get("role") == "user"]
        later = [i for i in users if i >= start]
        # Never start inside an exchange (a tool output without its call is refused by the API):
        # cut at a user message, keeping the whole last exchange even when it is over the limit.
        del self._items[: later[0] if later else users[-1] if users else 0]


class OpenAIRunner:
    """Runs the turns of SDK agents: the seam of ``OpenAIModule(agents, runner=...)``.

    The default runs each turn with the SDK's ``Runner`` on the session's conversation, bounded
    by the agent's timeout, with model failures mapped to retries or errors. Subclass it to wrap
    every run of a module's agents (a tracing span, metrics, a context of your own) and pass an
    instance::

        class TracedRunner(OpenAIRunner):
            async def run(self, agent: OpenAIAgent, turn: Turn) -> str:
                with span(agent.name, session_id=turn.session_id):  # your tracer's
                    return await super().run(agent, turn)

            async def stream(self, agent: OpenAIAgent, turn: Turn) -> AsyncIterator[str]:
                with span(agent.name, session_id=turn.session_id):
                    async for delta in super().stream(agent, turn):
                        yield delta

        OpenAIModule([triage, billing], runner=TracedRunner())

    ``run`` serves plain turns, ``stream`` streamed ones; ``agent.sdk_agent`` is the SDK agent.
    """

    def options(self, agent: OpenAIAgent, turn: Turn) -> dict[str, Any]:
        """The keyword arguments of the SDK's ``Runner.run``/``run_streamed`` for ``turn``."""
        return {
            "session": agent.session(turn),
            "context": turn,
            "max_turns": agent.max_turns,
            "run_config": agent.run_config,
        }

    async def run(self, agent: OpenAIAgent, turn: Turn) -> str:
        """Run ``turn`` without streaming; returns the final output as text."""
        try:
            run = sdk.Runner.run(agent.sdk_agent, turn.prompt, **self.options(agent, turn))
            result = await asyncio.wait_for(run, agent.run_timeout)
        except Exception as exc:
            agent.fail(exc)
        return str(result.final_output)

    async def stream(self, agent: OpenAIAgent, turn: Turn) -> AsyncIterator[str]:
        """Run ``turn`` streamed; yields the text deltas of the SDK's streamed run."""
        options = self.options(agent, turn)
        result = sdk.Runner.run_streamed(agent.sdk_agent, turn.prompt, **options)
        events = result.stream_events()
        try:
            async for event in within(events, agent.run_timeout):
                if event.type == "raw_response_event" and isinstance(
                    event.data, ResponseTextDeltaEvent
                ):
                    yield event.data.delta
        except Exception as exc:
            agent.fail(exc)
        finally:
            result.cancel()
            if isinstance(events, AsyncGenerator):
                await events.aclose()


class OpenAIAgent(Agent):
    """One SDK agent as an agentkernel agent (made by :class:`OpenAIModule`)."""

    def __init__(
        self,
        name: str,
        sdk_agent: sdk.Agent[Any],
        *,
        max_turns: int,
        timeout: float,
        max_history_items: int | None,
        run_config: sdk.RunConfig | None,
        runner: OpenAIRunner | None = None,
    ) -> None:
        super().__init__(name, self._reply, sdk_agent.handoff_description or "")
        self.sdk_agent = sdk_agent
        self.max_turns, self.run_timeout = max_turns, timeout
        self.max_history_items, self.run_config = max_history_items, run_config
        self.runner = runner if runner is not None else OpenAIRunner()

    def session(self, turn: Turn) -> TurnSession:
        """The SDK ``Session`` of ``turn``'s conversation (kept in the turn's state)."""
        items = turn.state.setdefault(HISTORY_KEY, [])
        return TurnSession(turn.session_id, items, self.max_history_items)

    async def run(self, turn: Turn) -> str:
        """Run the turn without streaming (by the module's runner)."""
        return await self.runner.run(self, turn)

    async def _reply(self, turn: Turn) -> AsyncIterator[str]:
        """The streaming turn (by the module's runner)."""
        async for delta in self.runner.stream(self, turn):
            yield delta

    def fail(self, exc: Exception) -> NoReturn:
        """Raise what the pipeline makes of ``exc`` from a run of this agent (a retry or an
        error reply, :func:`~agentkernel.core.model_errors.raise_model_failure`)."""
        raise_model_failure(f"agent '{self.name}'", self.run_timeout, exc)


class OpenAIModule(Module):
    """Registers OpenAI Agents SDK agents (handoffs between them work as in the SDK).

    Args:
        agents: SDK ``Agent`` objects, registered under their ``name``; or a mapping from the
            agentkernel name to the agent (for SDK names with spaces).
        registry: where to register them; default the process-wide registry.
        max_turns: the SDK's limit of model calls per turn.
        timeout: seconds a turn may take in all (model calls, tools, handoffs); past it the
            turn is retried like a rate limit.
        max_history_items: conversation items kept per session (``None``: all). The state is
            stored as one value, so keep it well below the store's item size limit.
        runner: runs the turns of these agents (an :class:`OpenAIRunner`, a subclass that wraps
            each run); default a plain :class:`OpenAIRunner`.
        run_config: the SDK's ``RunConfig`` for every run (model provider, tracing, ...).

    Raises:
        ValueError: an agent's name is not a valid agentkernel name or is taken.
        TypeError: ``runner`` is not an :class:`OpenAIRunner`.
    """

    def __init__(
        self,
        agents: Iterable[sdk.Agent[Any]] | Mapping[str, sdk.Agent[Any]],
        runner: OpenAIRunner | None = None,
        *,
        registry: AgentRegistry | None = None,
        max_turns: int = 10,
        timeout: float = 300.0,
        max_history_items: int | None = 500,
        run_config: sdk.RunConfig | None = None,
    ) -> None:
        runner = _checked(runner) if runner is not None else OpenAIRunner()
        named = agents.items() if isinstance(agents, Mapping) else ((a.name, a) for a in agents)
        wrapped = [
            OpenAIAgent(
                name,
                sdk_agent,
                max_turns=max_turns,
                timeout=timeout,
                max_history_items=max_history_items,
                run_config=run_config,
                runner=runner,
            )
            for name, sdk_agent in named
        ]
        super().__init__(wrapped, registry)


def _checked(runner: Any) -> OpenAIRunner:
    """``runner``, refused at once when it cannot run a turn (rather than failing every turn)."""
    if not isinstance(runner, OpenAIRunner):
        raise TypeError(
            f"runner must be an agentkernel.openai.OpenAIRunner, not {type(runner).__name__}"
        )
    for method in (runner.run, runner.stream):
        try:
            inspect.signature(method).bind(None, None)
        except TypeError as exc:
            raise TypeError(
                f"{type(runner).__name__}.{method.__name__} must take (agent, turn); upstream's "
                "run(agent, session, requests) is rewritten as shown in docs/migrating.md"
            ) from exc
    return runner
