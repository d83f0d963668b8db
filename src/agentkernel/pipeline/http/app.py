"""The FastAPI application: middleware, error shapes, and every route over one chat front.

Chat routes are in :mod:`.rest`, the socket in :mod:`.websocket`; the service routes (agents,
health, readiness, metrics) are the few lines below. Each asks the
:class:`~agentkernel.pipeline.front.chat_front.ChatFront` and translates its answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from fastapi import APIRouter, FastAPI, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from agentkernel.auth import AuthValidator
from agentkernel.core.errors import AKConfigError
from agentkernel.pipeline.front.chat_front import CHAT_PATH, ChatFront
from agentkernel.pipeline.front.sessions import SESSIONS_PATH
from agentkernel.pipeline.http import openapi, playground
from agentkernel.pipeline.http.access_log import AccessLogMiddleware, protect_server_logs
from agentkernel.pipeline.http.auth import IDENTITY, OPEN_PATHS, Authenticator, AuthMiddleware
from agentkernel.pipeline.http.errors import install_error_handlers
from agentkernel.pipeline.http.public_routes import public_paths
from agentkernel.pipeline.http.rest import ChatRoutes, SessionRoutes, json_response
from agentkernel.pipeline.http.socket_gate import SocketGate
from agentkernel.pipeline.http.websocket import ChatSocket
from agentkernel.pipeline.runtime.metrics import METRICS

__all__ = ["AgentAPI", "RouterSource", "build_app", "routers_of"]


class HasRouter(Protocol):
    """What upstream's ``RESTRequestHandler`` offers: the routes it serves."""

    def get_router(self) -> APIRouter: ...


#: A handler mounted beside the API's routes.
RouterSource = HasRouter | APIRouter


class AgentAPI(FastAPI):
    """The FastAPI application, with the chat POST served ahead of FastAPI's per-request work.

    ``POST /api/v1/chat`` is the route every turn takes, and it reads its raw request and
    answers a response itself, so FastAPI's machinery around it (its telemetry and body-limit
    middleware, the router's matching against every route, two exit stacks, the exception
    middleware's send wrapper) is work for nothing: about 50 us of CPU per turn, a tenth of an
    embedded no-op turn. That request runs through the application's own middleware (the
    authentication and the access log, and any a user adds) and its 500 handler, as every
    other request does; the FastAPI route of the same path stays for the OpenAPI document.
    """

    #: The chat POST as an ASGI application (set by :func:`build_app`).
    chat_post: ASGIApp | None = None
    _chat_stack: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and _route_path(scope) == CHAT_PATH
            and self.chat_post is not None
        ):
            scope["app"] = self
            if self._chat_stack is None:
                self._chat_stack = self._build_chat_stack(self.chat_post)
            await self._chat_stack(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def _build_chat_stack(self, app: ASGIApp) -> ASGIApp:
        """``app`` inside the user middleware and the 500 handler, as Starlette stacks them."""
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        handler = self.exception_handlers.get(Exception) or self.exception_handlers.get(500)
        return ServerErrorMiddleware(app, handler=handler, debug=self.debug)


def _route_path(scope: Scope) -> str:
    """The path the router matches: without the ``root_path`` a mount put in front of it."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def build_app(
    front: ChatFront,
    auth_validator: AuthValidator | None = None,
    handlers: Sequence[RouterSource] = (),
    *,
    with_playground: bool | None = None,
) -> FastAPI:
    """The application with every route of the HTTP API over ``front``.

    Args:
        front: the chat front the routes serve.
        auth_validator: checks bearer tokens on every route but ``/health`` and ``/ready``,
            turning authentication on even when ``api.auth.enabled`` is off.
        handlers: more routes, mounted after the API's own (which keep their paths): objects
            with ``get_router()`` (upstream's ``RESTRequestHandler``) or FastAPI routers.
            Authentication covers them like every other route.
        with_playground: serve the playground page (:mod:`.playground`); ``None`` follows
            ``api.playground``, off when that is unset.

    Raises:
        AKConfigError: a handler is neither a router nor has ``get_router()``.
    """
    app = AgentAPI(
        title="agentkernel",
        version="1",
        docs_url="/docs",
        redoc_url=None,
        redirect_slashes=False,  # a JSON 404, not an empty 307, for "/health/"
    )
    install_error_handlers(app)
    protect_server_logs()
    api = front.config.api
    if with_playground is None:
        with_playground = bool(api.playground)
    if api.auth.enabled or auth_validator is not None:
        page = playground.PATHS if with_playground else frozenset()
        app.add_middleware(
            AuthMiddleware,
            authenticator=Authenticator(api.auth, auth_validator),
            open_paths=OPEN_PATHS | public_paths(api.limits.public_routes) | page,
        )
    if api.access_log:
        app.add_middleware(AccessLogMiddleware)  # outermost: refused requests are logged too
    routes = ChatRoutes(front)
    _chat_routes(app, routes, SocketGate(api.limits))
    app.chat_post = routes.post_chat_app
    _session_routes(app, SessionRoutes(front))
    _service_routes(app, front)
    if with_playground:
        playground.install(app)
    for router in routers_of(handlers):
        app.include_router(router)
    openapi.install(app)
    return app


def routers_of(handlers: Sequence[RouterSource]) -> list[APIRouter]:
    """The router of each handler: itself, or what its ``get_router()`` returns (``None``
    entries are skipped, as upstream does)."""
    routers = []
    for handler in handlers:
        if handler is None:
            continue
        router = handler if isinstance(handler, APIRouter) else _get_router(handler)
        if not isinstance(router, APIRouter):
            raise AKConfigError(
                f"handlers: {type(handler).__name__} is neither a FastAPI APIRouter nor has a "
                "get_router() that returns one"
            )
        routers.append(router)
    return routers


def _get_router(handler: object) -> object:
    get_router = getattr(handler, "get_router", None)
    return get_router() if callable(get_router) else None


def _chat_routes(app: FastAPI, routes: ChatRoutes, gate: SocketGate) -> None:
    app.post(
        CHAT_PATH,
        status_code=200,
        responses=openapi.POST_RESPONSES,
        openapi_extra=openapi.POST_BODY,
    )(routes.post_chat)
    app.get(CHAT_PATH + "/{session_id}", responses=openapi.GET_RESPONSES)(routes.get_chat)
    app.get(CHAT_PATH, responses=openapi.GET_RESPONSES)(routes.poll_chat)
    app.get(CHAT_PATH + "/{session_id}/stream", responses=openapi.STREAM_RESPONSES)(
        routes.get_stream
    )
    app.post(CHAT_PATH + "/{session_id}/cancel", responses=openapi.CANCEL_RESPONSES)(
        routes.cancel_chat
    )

    async def websocket(websocket: WebSocket) -> None:
        """The chat WebSocket: ``CHAT_QUEUED``, then ``CHAT_RESPONSE`` or chunk frames."""
        async with gate.slot(websocket, IDENTITY.get()) as admitted:
            if admitted:
                await ChatSocket(routes.front, websocket).serve()

    app.websocket("/ws")(websocket)


def _session_routes(app: FastAPI, routes: SessionRoutes) -> None:
    one = SESSIONS_PATH + "/{session_id}"
    app.get(SESSIONS_PATH, responses=openapi.LIST_SESSIONS_RESPONSES)(routes.list_sessions)
    app.get(one, responses=openapi.SHOW_SESSION_RESPONSES)(routes.show_session)
    app.delete(one, status_code=204, responses=openapi.DELETE_SESSION_RESPONSES)(
        routes.delete_session
    )


def _service_routes(app: FastAPI, front: ChatFront) -> None:
    async def list_agents() -> dict[str, Any]:
        """The agents registered in this process."""
        doc: dict[str, Any] = front.agents().doc
        return doc

    async def health() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    async def ready() -> JSONResponse:
        """Readiness: the broker and the response store answer."""
        return json_response(await front.ready())

    async def metrics() -> PlainTextResponse:
        """Prometheus metrics of this process."""
        return PlainTextResponse(METRICS.render(), media_type="text/plain; version=0.0.4")

    app.get("/api/v1/agents", response_model=None, responses=openapi.AGENTS_RESPONSES)(list_agents)
    app.get("/health", response_model=None, responses=openapi.HEALTH_RESPONSES)(health)
    app.get("/ready", responses=openapi.READY_RESPONSES)(ready)
    app.get("/metrics", response_class=PlainTextResponse, responses=openapi.PROTECTED_RESPONSES)(
        metrics
    )
