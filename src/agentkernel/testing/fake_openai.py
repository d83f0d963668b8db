"""A local OpenAI-compatible model server, for tests and for trying agents without a network.

It is a real HTTP server (uvicorn on 127.0.0.1) speaking the two wire formats the OpenAI SDKs
use: ``POST /v1/responses`` (the OpenAI Agents SDK's default) and ``POST /v1/chat/completions``
(LangChain's ``ChatOpenAI``), each plain or streamed as Server-Sent Events. Its answers are
deterministic and depend on the whole conversation (rules in
:mod:`agentkernel.testing.fake_model`), so a test can check that an agent remembers::

    from agentkernel.testing.fake_openai import FakeOpenAI

    with FakeOpenAI() as model:          # listens on a free port
        os.environ.update(model.env())   # OPENAI_BASE_URL and OPENAI_API_KEY for the SDKs
        ...                              # "You said: hi. (1 messages from you so far.)"
        model.fail("rate_limit", times=1)  # the next request answers 429

Failure modes (:meth:`FakeOpenAI.fail`, or ``[fake:<mode>]`` in the user's message):
``rate_limit`` (429 with a short ``retry-after-ms``), ``bad_request`` (400), ``server_error``
(500), ``slow`` (answers after ``slow_seconds``), ``malformed`` (200 with a body that is not
the API's JSON).

Run it on its own with ``python -m agentkernel.testing.fake_openai --port 8100``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from agentkernel.testing.fake_model import (
    FAILURE_MODES,
    Answer,
    Conversation,
    Entry,
    answer,
    failure_marker,
)

_ERRORS = {
    "rate_limit": (429, "rate_limit_exceeded", "Rate limit reached (fake server)"),
    "bad_request": (400, "invalid_request_error", "Invalid request (fake server)"),
    "server_error": (500, "server_error", "The server had an error (fake server)"),
}


class FakeOpenAI:
    """The server; start it with ``with FakeOpenAI() as model:`` or :meth:`start`.

    Args:
        port: TCP port on 127.0.0.1 (0 = any free one).
        slow_seconds: how long a ``slow`` answer takes, in seconds.
        chunk_delay: seconds between streamed chunks.
    """

    def __init__(self, port: int = 0, slow_seconds: float = 30.0, chunk_delay: float = 0.0):
        self.slow_seconds = slow_seconds
        self.chunk_delay = chunk_delay
        self.requests: list[dict[str, Any]] = []  # bodies received, oldest first
        #: Wall-clock times at which a client gave up on a ``slow`` answer (closed its request).
        self.abandoned: list[float] = []
        self._failures: list[str] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        config = uvicorn.Config(
            self._app(), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
        config.timeout_graceful_shutdown = 2
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> FakeOpenAI:
        """Start serving on a background thread; returns once the port is open."""
        self._thread = threading.Thread(target=self._server.run, name="fake-openai", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake OpenAI server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving (a ``slow`` answer in progress is cut short)."""
        self._stopping.set()
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return int(self._server.servers[0].sockets[0].getsockname()[1])

    @property
    def base_url(self) -> str:
        """The ``base_url`` for an OpenAI client, e.g. ``http://127.0.0.1:8100/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def env(self) -> dict[str, str]:
        """Environment variables that point the OpenAI SDKs at this server."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": "sk-fake"}

    def fail(self, mode: str, times: int = 1) -> None:
        """Answer the next ``times`` requests with failure ``mode`` (see the module docstring)."""
        if mode not in FAILURE_MODES:
            raise ValueError(f"unknown failure mode {mode!r}; use one of {FAILURE_MODES}")
        with self._lock:
            self._failures.extend([mode] * times)

    # -- HTTP ----------------------------------------------------------------------------------

    def _app(self) -> FastAPI:
        app = FastAPI()
        app.add_api_route("/v1/responses", self._responses, methods=["POST"])
        app.add_api_route("/v1/chat/completions", self._chat, methods=["POST"])
        app.add_api_route("/v1/models", self._models, methods=["GET"])
        return app

    async def _models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

    async def _responses(self, request: Request) -> Response:
        body = await request.json()
        conversation = _responses_conversation(body)
        failed = await self._failure(body, conversation, request)
        if failed is not None:
            return failed
        result, model = answer(conversation), str(body.get("model") or "fake-model")
        n = next(self._ids)
        if body.get("stream"):
            return self._sse(_responses_events(result, model, n))
        return JSONResponse(_response_doc(result, model, n, "completed"))

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        conversation = _chat_conversation(body)
        failed = await self._failure(body, conversation, request)
        if failed is not None:
            return failed
        result, model = answer(conversation), str(body.get("model") or "fake-model")
        n = next(self._ids)
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return self._sse(_chat_chunks(result, model, n, usage), done_marker=True)
        return JSONResponse(_chat_doc(result, model, n))

    async def _failure(
        self, body: dict[str, Any], conversation: Conversation, request: Request
    ) -> Response | None:
        """Record the request and answer it with a failure if one is due."""
        with self._lock:
            self.requests.append(body)
            mode = self._failures.pop(0) if self._failures else None
        mode = mode or failure_marker(conversation)
        if mode == "slow":
            deadline = time.monotonic() + self.slow_seconds
            while time.monotonic() < deadline and not self._stopping.is_set():
                if await request.is_disconnected():  # the caller cancelled its model call
                    with self._lock:
                        self.abandoned.append(time.time())
                    return PlainTextResponse("", 499)
                await asyncio.sleep(0.05)
            return None
        if mode == "malformed" and body.get("stream"):
            broken = 'event: response.created\ndata: {"type": "response.cre\n\n'
            return PlainTextResponse(broken, media_type="text/event-stream")
        if mode == "malformed":
            return PlainTextResponse('{"id": "oops", "output": [', media_type="application/json")
        if mode in _ERRORS:
            status, code, message = _ERRORS[mode]
            error = {"message": message, "type": code, "param": None, "code": code}
            return JSONResponse({"error": error}, status, headers={"retry-after-ms": "20"})
        return None

    def _sse(self, events: Iterator[dict[str, Any]], done_marker: bool = False) -> Response:
        async def body() -> AsyncIterator[str]:
            for event in events:
                if self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                name = f"event: {event['type']}\n" if "type" in event else ""
                yield f"{name}data: {json.dumps(event)}\n\n"
            if done_marker:
                yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")


# -- reading requests ----------------------------------------------------------------------------


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _responses_conversation(body: dict[str, Any]) -> Conversation:
    conversation = Conversation(instructions=str(body.get("instructions") or ""))
    items = body.get("input") or []
    for item in [{"role": "user", "content": items}] if isinstance(items, str) else items:
        kind = item.get("type", "message")
        if kind == "function_call":
            conversation.entries.append(Entry("call", name=item["name"], call_id=item["call_id"]))
        elif kind == "function_call_output":
            text = _text_of(item.get("output"))
            conversation.entries.append(Entry("output", text, call_id=item["call_id"]))
        elif kind == "message" and item.get("role") in ("system", "developer"):
            conversation.instructions += _text_of(item.get("content"))
        elif kind == "message":
            conversation.entries.append(Entry(item.get("role", "user"), _text_of(item["content"])))
    for tool in body.get("tools") or []:
        if tool.get("type") == "function":
            conversation.tools[tool["name"]] = tool.get("parameters") or {}
    return conversation


def _chat_conversation(body: dict[str, Any]) -> Conversation:
    conversation = Conversation()
    for message in body.get("messages") or []:
        role, text = message.get("role"), _text_of(message.get("content"))
        if role in ("system", "developer"):
            conversation.instructions += text
        elif role == "tool":
            conversation.entries.append(Entry("output", text, call_id=message["tool_call_id"]))
        else:
            if text or role == "user":
                conversation.entries.append(Entry(role, text))
            for call in message.get("tool_calls") or []:
                name = call["function"]["name"]
                conversation.entries.append(Entry("call", name=name, call_id=call["id"]))
    for tool in body.get("tools") or []:
        function = tool.get("function") or {}
        conversation.tools[function["name"]] = function.get("parameters") or {}
    return conversation


# -- writing answers -----------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    """The text in chunks of one word with its following space: the stream's deltas."""
    words = text.split(" ")
    return [w + " " for w in words[:-1]] + [words[-1]]


def _usage(result: Answer) -> tuple[int, int]:
    out = result.tool_call.arguments if result.tool_call else result.text
    return 10, max(1, len(out.split()))


def _output_item(result: Answer, n: int, done: bool = True) -> dict[str, Any]:
    status = "completed" if done else "in_progress"
    if result.tool_call is not None:
        call = result.tool_call
        arguments = call.arguments if done else ""
        return {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}",
                "name": call.name, "arguments": arguments, "status": status}  # fmt: skip
    content = [_text_part(result.text)] if done else []
    return {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": status,
            "content": content}  # fmt: skip


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _response_doc(result: Answer | None, model: str, n: int, status: str) -> dict[str, Any]:
    inputs, outputs = _usage(result) if result else (0, 0)
    return {
        "id": f"resp_{n}", "object": "response", "created_at": int(time.time()),
        "status": status, "model": model, "error": None, "incomplete_details": None,
        "instructions": None, "metadata": {}, "parallel_tool_calls": True,
        "temperature": None, "top_p": None, "tool_choice": "auto", "tools": [],
        "text": {"format": {"type": "text"}}, "truncation": "disabled",
        "output": [_output_item(result, n)] if result else [],
        "usage": {
            "input_tokens": inputs, "output_tokens": outputs, "total_tokens": inputs + outputs,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }  # fmt: skip


def _responses_events(result: Answer, model: str, n: int) -> Iterator[dict[str, Any]]:
    """The Responses API's streamed events for one answer, numbered in order."""
    item_id = f"fc_{n}" if result.tool_call else f"msg_{n}"
    at = {"item_id": item_id, "output_index": 0}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": _response_doc(None, model, n, "in_progress")},
        {"type": "response.output_item.added", "output_index": 0,
         "item": _output_item(result, n, done=False)},
    ]  # fmt: skip
    if result.tool_call is not None:
        arguments = result.tool_call.arguments
        events += [
            {"type": "response.function_call_arguments.delta", **at, "delta": arguments},
            {"type": "response.function_call_arguments.done", **at, "arguments": arguments},
        ]
    else:
        part = {**at, "content_index": 0}
        events.append({"type": "response.content_part.added", **part, "part": _text_part("")})
        for delta in _words(result.text):
            events.append(
                {"type": "response.output_text.delta", **part, "delta": delta, "logprobs": []}
            )
        events += [
            {"type": "response.output_text.done", **part, "text": result.text, "logprobs": []},
            {"type": "response.content_part.done", **part, "part": _text_part(result.text)},
        ]
    events += [
        {"type": "response.output_item.done", "output_index": 0, "item": _output_item(result, n)},
        {"type": "response.completed", "response": _response_doc(result, model, n, "completed")},
    ]
    for number, event in enumerate(events):
        yield event | {"sequence_number": number}


def _chat_tool_calls(result: Answer, n: int) -> list[dict[str, Any]]:
    assert result.tool_call is not None
    function = {"name": result.tool_call.name, "arguments": result.tool_call.arguments}
    return [{"index": 0, "id": f"call_{n}", "type": "function", "function": function}]


def _chat_doc(result: Answer, model: str, n: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.text or None}
    if result.tool_call is not None:
        message["tool_calls"] = [
            {k: v for k, v in c.items() if k != "index"} for c in _chat_tool_calls(result, n)
        ]
    inputs, outputs = _usage(result)
    finish = "tool_calls" if result.tool_call else "stop"
    return {
        "id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": inputs, "completion_tokens": outputs,
                  "total_tokens": inputs + outputs},
    }  # fmt: skip


def _chat_chunks(result: Answer, model: str, n: int, usage: bool) -> Iterator[dict[str, Any]]:
    """The Chat Completions API's streamed chunks for one answer."""
    base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}  # fmt: skip

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return base | {"choices": [choice]}

    yield chunk({"role": "assistant", "content": ""})
    if result.tool_call is not None:
        yield chunk({"tool_calls": _chat_tool_calls(result, n)})
        yield chunk({}, "tool_calls")
    else:
        for delta in _words(result.text):
            yield chunk({"content": delta})
        yield chunk({}, "stop")
    if usage:
        inputs, outputs = _usage(result)
        totals = {"prompt_tokens": inputs, "completion_tokens": outputs,
                  "total_tokens": inputs + outputs}  # fmt: skip
        yield base | {"choices": [], "usage": totals}


def main(argv: list[str] | None = None) -> None:
    """``python -m agentkernel.testing.fake_openai [--port N]``: serve until interrupted."""
    parser = argparse.ArgumentParser(description="A local OpenAI-compatible model for tests.")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--slow-seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    server = FakeOpenAI(port=args.port, slow_seconds=args.slow_seconds).start()
    print(f"fake OpenAI API on {server.base_url}; export OPENAI_BASE_URL={server.base_url}")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
