"""Framework-free agents: a name plus a Python callable.

A handler receives a :class:`Turn` and returns the reply text. It may be a plain function, an
``async`` function, or a (sync or async) generator of text chunks, which makes a streaming
agent::

    from agentkernel import Agent, Module

    async def reply(turn):
        turn.state["n"] = turn.state.get("n", 0) + 1
        return f"{turn.prompt} #{turn.state['n']}"

    Module([Agent("echo", reply)])

``turn.state`` is a JSON-serialisable dict loaded before and saved after each successful turn of
the session, so any runner replica can serve the next turn.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentkernel.core.errors import AgentNotFoundError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass
class Turn:
    """One chat turn as an agent sees it.

    Attributes:
        prompt: the user's message.
        session_id: the conversation this turn belongs to.
        request_id: unique id of this turn (also the reply's key).
        agent: name of the agent running the turn.
        state: per-session JSON state; mutate it to keep data for the next turn.
        extra: any additional fields the client sent with the request.
        attempt: 1-based delivery number of this turn (above 1 after a retry).
        traceparent: W3C trace context of the request, carried through the queue, for
            correlating the agent's own spans and logs with the HTTP request.
        session_key: where the session is stored: ``session_id`` without authentication,
            otherwise unique per identity (two users' ``s1`` are two sessions). Key any
            storage of your own by it, not by ``session_id``; empty means ``session_id``.
        stopping: set once the turn is cancelled or runs past its deadline. An ``async`` agent
            is also cancelled at its next ``await``; a sync agent cannot be, so a long-running
            one should check :attr:`cancelled` between steps and return early.
    """

    prompt: str
    session_id: str
    request_id: str
    agent: str
    state: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1
    traceparent: str | None = None
    session_key: str = ""
    stopping: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.session_key:
            self.session_key = self.session_id

    @property
    def cancelled(self) -> bool:
        """Whether the turn was cancelled (or ran past its deadline): stop and return."""
        return self.stopping.is_set()


Handler = Callable[[Turn], Any]


class Agent:
    """An agent defined by a callable.

    Args:
        name: unique name clients use in the ``agent`` field (letters, digits, ``_.-``, 1-64).
        handler: ``f(turn) -> str``, ``async f(turn) -> str``, or a (sync or async) generator of
            ``str`` chunks for a streaming agent.
        description: shown by ``GET /api/v1/agents``.
        timeout: seconds a turn of this agent may run before it is cancelled and answered
            504 ``TURN_TIMEOUT``; default ``execution.runner.turn_timeout``.
    """

    def __init__(
        self, name: str, handler: Handler, description: str = "", timeout: float | None = None
    ) -> None:
        if not _NAME.match(name):
            raise ValueError(
                f"invalid agent name {name!r}: use 1-64 letters, digits, '_', '.', '-'"
            )
        if not callable(handler):
            raise TypeError("an agent handler must be callable")
        self.name = name
        self.handler = handler
        self.description = description
        if timeout is not None and timeout <= 0:
            raise ValueError("an agent's timeout must be a positive number of seconds")
        self.timeout = timeout
        self.streaming = inspect.isasyncgenfunction(handler) or inspect.isgeneratorfunction(handler)

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, streaming={self.streaming})"

    async def stream(self, turn: Turn) -> AsyncIterator[str]:
        """Yield the reply as text chunks (a non-streaming agent yields one chunk).

        Each chunk is encoded like a returned value: a dict or list as JSON, ``None`` as an
        empty chunk (which is not sent), anything else as ``str``.
        """
        handler = self.handler
        if inspect.isasyncgenfunction(handler):
            async for chunk in handler(turn):
                yield _text(chunk)
        elif inspect.isgeneratorfunction(handler):
            iterator = iter(handler(turn))
            sentinel = object()
            while (chunk := await asyncio.to_thread(next, iterator, sentinel)) is not sentinel:
                yield _text(chunk)
        else:
            yield await self.run(turn)

    async def run(self, turn: Turn) -> str:
        """Run the turn to completion and return the whole reply."""
        if self.streaming:
            return "".join([chunk async for chunk in self.stream(turn)])
        if inspect.iscoroutinefunction(self.handler):
            result = await self.handler(turn)
        else:
            result = await asyncio.to_thread(self.handler, turn)
            if inspect.isawaitable(result):
                result = await result
        return _text(result)


def _text(result: Any) -> str:
    """The reply text of an agent's return value: JSON for dicts and lists, ``str`` otherwise."""
    if result is None:
        return ""
    if isinstance(result, dict | list):
        return json.dumps(result)
    return str(result)


class AgentRegistry:
    """The agents a process can run, by name. :meth:`default` is the process-wide registry."""

    _default: ClassVar[AgentRegistry | None] = None
    _default_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._agents: dict[str, Agent] = {}
        self._lock = threading.Lock()

    @classmethod
    def default(cls) -> AgentRegistry:
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls()
            return cls._default

    @classmethod
    def reset(cls) -> None:
        """Forget every agent of the process-wide registry (tests)."""
        with cls._default_lock:
            cls._default = None

    def register(self, agent: Agent) -> None:
        with self._lock:
            if agent.name in self._agents and self._agents[agent.name] is not agent:
                raise ValueError(f"an agent named {agent.name!r} is already registered")
            self._agents[agent.name] = agent

    def unregister(self, agent: Agent) -> None:
        with self._lock:
            if self._agents.get(agent.name) is agent:
                del self._agents[agent.name]

    def get(self, name: str | None) -> Agent:
        """The agent called ``name``, or the first registered one when ``name`` is empty.

        Raises:
            AgentNotFoundError: no such agent (or none at all).
        """
        if name:  # one dict read, atomic: no lock on the path every turn takes
            agent = self._agents.get(name)
            if agent is None:
                raise AgentNotFoundError(f"no agent named {name!r}")
            return agent
        with self._lock:
            if not self._agents:
                raise AgentNotFoundError("no agent is registered")
            return next(iter(self._agents.values()))

    def agents(self) -> list[Agent]:
        with self._lock:
            return list(self._agents.values())

    def __contains__(self, name: object) -> bool:
        return name in self._agents  # one dict read, atomic


class Module:
    """A group of agents registered together (in the process-wide registry by default).

    Args:
        agents: the agents to register.
        registry: where to register them; default :meth:`AgentRegistry.default`.

    Raises:
        ValueError: an agent's name is already taken (nothing of this module is registered).
    """

    def __init__(self, agents: Iterable[Agent], registry: AgentRegistry | None = None) -> None:
        self.agents = list(agents)
        self.registry = registry if registry is not None else AgentRegistry.default()
        done: list[Agent] = []
        try:
            for agent in self.agents:
                self.registry.register(agent)
                done.append(agent)
        except ValueError:
            for agent in done:
                self.registry.unregister(agent)
            raise

    def unload(self) -> None:
        """Remove this module's agents from the registry."""
        for agent in self.agents:
            self.registry.unregister(agent)
