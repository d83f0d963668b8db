"""Compiled LangGraph graphs served by agentkernel (extra ``langgraph``).

::

    from langchain_openai import ChatOpenAI
    from langgraph.graph import START, MessagesState, StateGraph
    from agentkernel.langgraph import LangGraphModule

    model = ChatOpenAI(model="gpt-4o-mini", timeout=30)

    def chat(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState).add_node(chat).add_edge(START, "chat")
    LangGraphModule([builder.compile(name="chat")])

Each graph is registered under its ``name`` (clients pick it with the ``agent`` field). A turn
runs the graph with the session id as its ``thread_id`` and a checkpointer,
:class:`TurnStateSaver`, that keeps the thread's latest checkpoint in the turn's state, which the
Agent Runner commits together with the reply in the session store: the next turn, on any runner
sharing that store, resumes from it. A failed turn leaves the thread as it was.

By default the input is ``{"messages": [{"role": "user", "content": prompt}]}`` and the reply is
the text of the last message of the output (pass ``make_input``/``read_output`` for other state
shapes). Streaming turns yield the text of AI message chunks (``stream_mode="messages"``).
Model failures are mapped like :mod:`agentkernel.openai`'s, and turns are bounded by ``timeout``.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, NoReturn

from agentkernel.core.agent import Agent, AgentRegistry, Module, Turn
from agentkernel.core.extras import require_extra
from agentkernel.core.model_errors import raise_model_failure, within

with require_extra("langgraph", "agentkernel.langgraph"):
    from langchain_core.messages import AIMessage, BaseMessage
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
    )
    from langgraph.pregel import Pregel

__all__ = ["CHECKPOINT_KEY", "LangGraphAgent", "LangGraphModule", "TurnStateSaver"]

#: Where the thread's checkpoints are kept in ``turn.state``.
CHECKPOINT_KEY = "langgraph"


class TurnStateSaver(BaseCheckpointSaver[int]):
    """A checkpointer over a JSON dict (the turn's state): the latest checkpoint per namespace.

    Only the latest checkpoint of each namespace (the graph and each subgraph) and its pending
    writes are kept, so the state stays small: resuming and interrupts work, time travel to an
    older checkpoint does not. Values are serialised with the saver's ``serde`` and kept as
    base64 text.

    Args:
        store: the dict to keep checkpoints in (``turn.state[CHECKPOINT_KEY]``).
    """

    def __init__(self, store: dict[str, Any]) -> None:
        super().__init__()
        self.store = store

    def _dump(self, value: Any) -> list[str]:
        kind, data = self.serde.dumps_typed(value)
        return [kind, base64.b64encode(data).decode()]

    def _load(self, value: list[str]) -> Any:
        return self.serde.loads_typed((value[0], base64.b64decode(value[1])))

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        configurable = config["configurable"]
        ns = configurable.get("checkpoint_ns", "")
        saved = self.store.get(ns)
        wanted = get_checkpoint_id(config)
        if saved is None or (wanted and wanted != saved["id"]):
            return None
        thread = configurable["thread_id"]
        parent = saved["parent"]
        return CheckpointTuple(
            config=_config(thread, ns, saved["id"]),
            checkpoint=self._load(saved["checkpoint"]),
            metadata=self._load(saved["metadata"]),
            parent_config=_config(thread, ns, parent) if parent else None,
            pending_writes=[(w[0], w[1], self._load(w[2])) for w in saved["writes"]],
        )

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        found = self.get_tuple(config) if config is not None and before is None else None
        wanted = (filter or {}).items()
        if found is not None and limit != 0 and all(found.metadata.get(k) == v for k, v in wanted):
            yield found

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        configurable = config["configurable"]
        ns = configurable.get("checkpoint_ns", "")
        self.store[ns] = {
            "id": checkpoint["id"],
            "parent": configurable.get("checkpoint_id"),
            "checkpoint": self._dump(checkpoint),
            "metadata": self._dump(get_checkpoint_metadata(config, metadata)),
            "writes": [],
        }
        return _config(configurable["thread_id"], ns, checkpoint["id"])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        configurable = config["configurable"]
        saved = self.store.get(configurable.get("checkpoint_ns", ""))
        if saved is None or saved["id"] != configurable["checkpoint_id"]:
            return  # writes of a checkpoint that is no longer the latest
        kept = {(w[0], w[3]) for w in saved["writes"]}
        for idx, (channel, value) in enumerate(writes):
            key = (task_id, WRITES_IDX_MAP.get(channel, idx))
            if key[1] >= 0 and key in kept:
                continue  # as in LangGraph's own savers: a task's regular writes are kept once
            saved["writes"].append([task_id, channel, self._dump(value), key[1]])

    def delete_thread(self, thread_id: str) -> None:
        self.store.clear()

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.get_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for found in self.list(config, filter=filter, before=before, limit=limit):
            yield found

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        self.delete_thread(thread_id)


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def messages_input(turn: Turn) -> Any:
    """The default graph input: the prompt as a user message."""
    return {"messages": [{"role": "user", "content": turn.prompt}]}


def last_message_text(output: Any) -> str:
    """The default reply: the text of the last message of the graph's output state."""
    messages = output.get("messages") if isinstance(output, Mapping) else None
    if not messages:
        raise ValueError("the graph's output has no messages; pass read_output to the module")
    last = messages[-1]
    return _text(last) if isinstance(last, BaseMessage) else str(last)


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(
        p if isinstance(p, str) else str(p.get("text", "")) for p in content if p is not None
    )


class LangGraphAgent(Agent):
    """One compiled graph as an agentkernel agent (made by :class:`LangGraphModule`)."""

    def __init__(
        self,
        name: str,
        graph: Pregel[Any, Any, Any, Any],
        *,
        timeout: float,
        make_input: Callable[[Turn], Any],
        read_output: Callable[[Any], str],
        config: RunnableConfig | None,
    ) -> None:
        super().__init__(name, self._reply, getattr(graph, "description", None) or "")
        self.graph, self.run_timeout = graph, timeout
        self.make_input, self.read_output, self.config = make_input, read_output, config

    def _bound(self, turn: Turn) -> tuple[Pregel[Any, Any, Any, Any], RunnableConfig]:
        """The graph with the turn's checkpointer, and the run's config (thread = session)."""
        saver = TurnStateSaver(turn.state.setdefault(CHECKPOINT_KEY, {}))
        config: dict[str, Any] = dict(self.config or {})
        configurable = dict(config.get("configurable") or {})
        config["configurable"] = configurable | {"thread_id": turn.session_id, "turn": turn}
        return self.graph.copy(update={"checkpointer": saver}), config  # type: ignore[return-value]

    async def run(self, turn: Turn) -> str:
        """Run the turn without streaming; returns the reply read from the output state."""
        graph, config = self._bound(turn)
        try:
            output = await asyncio.wait_for(
                graph.ainvoke(self.make_input(turn), config), self.run_timeout
            )
        except Exception as exc:
            self._fail(exc)
        return self.read_output(output)

    async def _reply(self, turn: Turn) -> AsyncIterator[str]:
        """The streaming turn: text of the AI message chunks the graph's models produce."""
        graph, config = self._bound(turn)
        stream = graph.astream(self.make_input(turn), config, stream_mode="messages")
        try:
            async for message, _ in within(stream, self.run_timeout):
                if isinstance(message, AIMessage) and (text := _text(message)):
                    yield text
        except Exception as exc:
            self._fail(exc)
        finally:
            if isinstance(stream, AsyncGenerator):
                await stream.aclose()

    def _fail(self, exc: Exception) -> NoReturn:
        raise_model_failure(f"graph '{self.name}'", self.run_timeout, exc)


class LangGraphModule(Module):
    """Registers compiled LangGraph graphs; each session is a thread kept in the session store.

    Args:
        graphs: compiled graphs, registered under their ``name`` (``compile(name=...)``); or a
            mapping from the agentkernel name to the graph.
        registry: where to register them; default the process-wide registry.
        timeout: seconds a turn may take in all; past it the turn is retried like a rate limit.
        make_input: builds the graph input from the turn; default :func:`messages_input`.
        read_output: reads the reply from the output state; default :func:`last_message_text`.
        config: extra ``RunnableConfig`` for every run (``recursion_limit``, callbacks, ...);
            ``configurable.thread_id`` is always the session id and ``configurable.turn`` the
            :class:`~agentkernel.Turn`.

    Raises:
        ValueError: a graph's name is not a valid agentkernel name or is taken.
    """

    def __init__(
        self,
        graphs: Iterable[Pregel[Any, Any, Any, Any]] | Mapping[str, Pregel[Any, Any, Any, Any]],
        *,
        registry: AgentRegistry | None = None,
        timeout: float = 300.0,
        make_input: Callable[[Turn], Any] = messages_input,
        read_output: Callable[[Any], str] = last_message_text,
        config: RunnableConfig | None = None,
    ) -> None:
        named = graphs.items() if isinstance(graphs, Mapping) else ((g.name, g) for g in graphs)
        wrapped = [
            LangGraphAgent(
                name,
                graph,
                timeout=timeout,
                make_input=make_input,
                read_output=read_output,
                config=config,
            )
            for name, graph in named
        ]
        super().__init__(wrapped, registry)
