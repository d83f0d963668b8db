"""The chat POST is served ahead of FastAPI's per-request machinery (``AgentAPI``): it must still
go through the application's own middleware, its 500 handler, and a mount's path prefix."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.pipeline.response_store.in_memory import InMemoryResponseStore
from agentkernel.pipeline.response_store.watch import ReplyWatch

BODY = {"session_id": "s", "prompt": "hi", "agent": "echo"}


class Tagging:
    """A user's middleware: tags every HTTP response with the path it answered."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"x-tagged", scope["path"].encode())]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, tagged)


class BuggyWatchStore(InMemoryResponseStore):
    """A store with a bug on the sync path only: an exception nobody mapped."""

    def watch(self, request_id: str) -> ReplyWatch:
        raise RuntimeError("bug in the store")


def tagged(wrap: Callable[[ASGIApp], ASGIApp] | None = None) -> Callable[[IOHandler], None]:
    """Add :class:`Tagging` to the handler's app, then put ``wrap`` around the app."""

    def prepare(handler: IOHandler) -> None:
        app = handler.server.config.app
        app.add_middleware(Tagging)
        if wrap is not None:
            handler.server.config.app = wrap(app)

    return prepare


def test_the_chat_post_goes_through_the_apps_own_middleware(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(prepare=tagged())
    response = server.client.post("/api/v1/chat", json=BODY)
    assert (response.status_code, response.json()["result"]) == (200, "hi #1")
    assert response.headers["x-tagged"] == "/api/v1/chat"
    assert server.client.get("/health").headers["x-tagged"] == "/health"  # the FastAPI path


def test_a_refused_chat_post_is_answered_in_the_json_error_shape(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(prepare=tagged())
    limit = server.handler.config.api.max_body_bytes
    too_large = server.client.post("/api/v1/chat", content=b" " * (limit + 1))
    assert (too_large.status_code, too_large.json()["error"]) == (413, "BODY_TOO_LARGE")
    assert too_large.headers["x-tagged"] == "/api/v1/chat"
    invalid = server.client.post("/api/v1/chat", json={"session_id": "s"})
    assert (invalid.status_code, invalid.json()["error"]) == (422, "INVALID_REQUEST")


def test_a_bug_on_the_chat_post_is_a_json_500(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(store=BuggyWatchStore(), prepare=tagged())
    response = server.client.post("/api/v1/chat", json=BODY)
    assert (response.status_code, response.json()["error"]) == (500, "INTERNAL_ERROR")
    assert "Traceback" not in response.text and "bug" not in response.text


def test_the_chat_post_is_served_under_a_mount(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(prepare=tagged(lambda app: Starlette(routes=[Mount("/agents", app=app)])))
    response = server.client.post("/agents/api/v1/chat", json=BODY)
    assert (response.status_code, response.json()["result"]) == (200, "hi #1")
    assert server.client.post("/api/v1/chat", json=BODY).status_code == 404
    other = httpx.post(f"{server.url}/agents/api/v1/chat/s/cancel", params={"request_id": "r"})
    assert other.status_code != 405  # the mounted app's other routes answer as before
