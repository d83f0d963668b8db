"""The deterministic "model" behind :mod:`agentkernel.testing.fake_openai`.

It reads a conversation (already converted from either wire format into :class:`Conversation`)
and decides the next assistant step, by fixed rules, so tests can assert on memory and tools:

1. **Tool calls.** A tool offered in the request is called when its name appears in the last
   user message and it was not called since that message; the first such name in the message
   wins. String parameters get the text after the tool's name, numbers the numbers found there,
   booleans ``true``. An OpenAI Agents SDK handoff is a tool (``transfer_to_<agent>``), so
   ``"transfer_to_billing please"`` hands off.
2. **Text answers** otherwise::

       [<persona>] You said: <last user message>. Before that you said: <previous one>.
       (<n> messages from you so far.) <tool> returned <output>.

   ``<persona>`` is the system instructions up to the first period or line end (60 characters
   at most); each part is left out when it has nothing to say.
3. **Failure markers.** A last user message containing ``[fake:<mode>]`` (``rate_limit``,
   ``bad_request``, ``server_error``, ``slow``, ``malformed``) makes the server fail that way
   every time it is asked (see :data:`FAILURE_MODES`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

#: Failure modes the server can be switched to, per request or by a marker in the prompt.
FAILURE_MODES = ("rate_limit", "bad_request", "server_error", "slow", "malformed")

_MARKER = re.compile(r"\[fake:([a-z_]+)\]")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass
class Entry:
    """One conversation item: a message, a tool call, or a tool's output."""

    kind: str  # "user", "assistant", "call" or "output"
    text: str = ""
    name: str = ""
    call_id: str = ""


@dataclass
class Conversation:
    """What a request asks the model: instructions, the items so far, and the tools offered."""

    instructions: str = ""
    entries: list[Entry] = field(default_factory=list)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> JSON schema


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text


@dataclass
class Answer:
    """The model's step: either text or one tool call."""

    text: str = ""
    tool_call: ToolCall | None = None


def failure_marker(conversation: Conversation) -> str | None:
    """The failure mode named by a ``[fake:<mode>]`` marker in the last user message."""
    match = _MARKER.search(_last_user(conversation))
    return match.group(1) if match and match.group(1) in FAILURE_MODES else None


def answer(conversation: Conversation) -> Answer:
    """The next assistant step for ``conversation`` (see the module docstring for the rules)."""
    call = _tool_to_call(conversation)
    if call is not None:
        return Answer(tool_call=call)
    return Answer(text=_text(conversation))


def _last_user(conversation: Conversation) -> str:
    users = [e.text for e in conversation.entries if e.kind == "user"]
    return users[-1] if users else ""


def _since_last_user(conversation: Conversation) -> list[Entry]:
    entries = conversation.entries
    starts = [i for i, e in enumerate(entries) if e.kind == "user"]
    return entries[starts[-1] + 1 :] if starts else list(entries)


def _tool_to_call(conversation: Conversation) -> ToolCall | None:
    text = _last_user(conversation)
    lowered = text.lower()
    called = {e.name for e in _since_last_user(conversation) if e.kind == "call"}
    found = [
        (lowered.find(name.lower()), name)
        for name in conversation.tools
        if name.lower() in lowered and name not in called
    ]
    if not found:
        return None
    position, name = min(found)
    rest = text[position + len(name) :].strip(" :,.!?")
    arguments = _arguments(conversation.tools[name], rest)
    return ToolCall(name, json.dumps(arguments))


def _arguments(schema: dict[str, Any], rest: str) -> dict[str, Any]:
    numbers = [float(n) if "." in n else int(n) for n in _NUMBER.findall(rest)]
    arguments: dict[str, Any] = {}
    for name, spec in (schema.get("properties") or {}).items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        if kind in ("integer", "number"):
            arguments[name] = numbers.pop(0) if numbers else 0
        elif kind == "boolean":
            arguments[name] = True
        else:
            arguments[name] = rest
    return arguments


def _text(conversation: Conversation) -> str:
    users = [e.text for e in conversation.entries if e.kind == "user"]
    parts = []
    persona = re.split(r"[.\n]", conversation.instructions.strip(), maxsplit=1)[0][:60]
    if persona:
        parts.append(f"[{persona}]")
    if users:
        parts.append(f"You said: {users[-1]}.")
    if len(users) > 1:
        parts.append(f"Before that you said: {users[-2]}.")
    parts.append(f"({len(users)} messages from you so far.)")
    names = {e.call_id: e.name for e in conversation.entries if e.kind == "call"}
    for entry in _since_last_user(conversation):
        if entry.kind == "output":
            parts.append(f"{names.get(entry.call_id, 'a tool')} returned {entry.text}.")
    return " ".join(parts)
