"""A LangGraph chat graph with a tool, served by agentkernel.

Run it: ``agentkernel serve examples/langgraph_agent.py``, with ``OPENAI_API_KEY`` set, or
offline against the fake model server (``python -m agentkernel.testing.fake_openai --port 8100``
then ``OPENAI_BASE_URL=http://127.0.0.1:8100/v1 OPENAI_API_KEY=sk-fake``). Needs
``pip install 'agentkernel[langgraph]' langchain-openai``.
"""

import os

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agentkernel.langgraph import LangGraphModule


@tool
def word_count(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


# A bounded model call: the turn is retried (or answered with an error) instead of hanging.
model = ChatOpenAI(model=os.environ.get("OPENAI_MODEL", "gpt-4.1-mini"), timeout=60)
model_with_tools = model.bind_tools([word_count])


def chat(state: MessagesState) -> dict:
    system = ("system", "Writer. Answer briefly; use word_count to count words.")
    return {"messages": [model_with_tools.invoke([system, *state["messages"]])]}


builder = StateGraph(MessagesState)
builder.add_node("chat", chat)
builder.add_node("tools", ToolNode([word_count]))
builder.add_edge(START, "chat")
builder.add_conditional_edges("chat", tools_condition)  # to "tools" on a tool call, else end
builder.add_edge("tools", "chat")

LangGraphModule([builder.compile(name="writer")])
