"""The agents the adapter tests run: an OpenAI Agents SDK triage agent that hands off to a
billing agent with a tool, and a LangGraph graph with a tool node, all talking to the fake model
server named by ``OPENAI_BASE_URL``."""

from __future__ import annotations

import os
from typing import Any

import httpx
from agents import Agent as SDKAgent
from agents import OpenAIResponsesModel, function_tool
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from openai import AsyncOpenAI

from agentkernel import AgentRegistry
from agentkernel.langgraph import LangGraphModule
from agentkernel.openai import OpenAIModule

#: Seconds a turn may take before it is retried (the fake model's slow answers take longer).
TURN_TIMEOUT = float(os.environ.get("ADAPTER_TURN_TIMEOUT", "1.5"))


@function_tool
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@tool
def lookup(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def openai_agents() -> list[SDKAgent[Any]]:
    # No client retries: a rate limit reaches the pipeline at once, so its retry is observable.
    client = AsyncOpenAI(max_retries=0)
    model = OpenAIResponsesModel(model="fake-model", openai_client=client)
    billing = SDKAgent(
        name="billing",
        instructions="Billing agent. Answer questions about invoices.",
        handoff_description="Handles billing questions.",
        tools=[add],
        model=model,
    )
    triage = SDKAgent(
        name="triage",
        instructions="Triage. Hand billing questions to the billing agent.",
        handoffs=[billing],
        model=model,
    )
    return [triage, billing]


def helper_graph() -> Any:
    llm = ChatOpenAI(model="fake-model", max_retries=0, timeout=10).bind_tools([lookup])

    def chat(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke([("system", "Helper. Kind."), *state["messages"]])]}

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_node("tools", ToolNode([lookup]))
    builder.add_edge(START, "chat")
    builder.add_conditional_edges("chat", tools_condition)
    builder.add_edge("tools", "chat")
    return builder.compile(name="helper")


def async_helper_graph() -> Any:
    """``helper`` with an async model node and a client of its own: a cancelled turn aborts
    its model call (a sync node's call runs on a thread to its end)."""
    client = httpx.AsyncClient(timeout=10)  # LangChain's shared default is bound to one loop
    llm = ChatOpenAI(model="fake-model", max_retries=0, timeout=10, http_async_client=client)

    async def chat(state: MessagesState) -> dict[str, Any]:
        reply = await llm.ainvoke([("system", "Helper. Kind."), *state["messages"]])
        return {"messages": [reply]}

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_edge(START, "chat")
    return builder.compile(name="helper_async")


def register(registry: AgentRegistry | None = None) -> AgentRegistry:
    """Register both modules (in the process-wide registry by default)."""
    registry = registry if registry is not None else AgentRegistry.default()
    OpenAIModule(openai_agents(), registry=registry, timeout=TURN_TIMEOUT)
    LangGraphModule([helper_graph()], registry=registry, timeout=TURN_TIMEOUT)
    return registry
