"""The Request Handler: the chat front (:mod:`~agentkernel.pipeline.front.chat_front`) over HTTP.

``RequestHandler(transport, store, config, registry)`` is the front; :meth:`build_app` gives
the FastAPI application (:mod:`agentkernel.pipeline.http.app`) that serves it, with the REST
routes, the ``/ws`` socket and the service routes. The Lambda function serves the same front
(:mod:`agentkernel.aws.request`).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI

from agentkernel.auth import AuthValidator
from agentkernel.pipeline.front.chat_front import CHAT_PATH, ChatFront, poll_location
from agentkernel.pipeline.http.app import RouterSource, build_app
from agentkernel.pipeline.wire.chat import ChatRequest, HTTPError, parse_chat

__all__ = [
    "CHAT_PATH",
    "ChatRequest",
    "HTTPError",
    "RequestHandler",
    "build_app",
    "parse_chat",
    "poll_location",
]


class RequestHandler(ChatFront):
    """The chat front with the FastAPI application that serves it (see :class:`ChatFront`)."""

    def build_app(
        self,
        auth_validator: AuthValidator | None = None,
        handlers: Sequence[RouterSource] = (),
        *,
        with_playground: bool | None = None,
    ) -> FastAPI:
        """The application with every route of the HTTP API (arguments: see :func:`build_app`)."""
        return build_app(self, auth_validator, handlers, with_playground=with_playground)
