"""Every error of the HTTP API as the same JSON object: ``{"error": CODE, "message": ...}``.

Errors the routes raise (:class:`HTTPError`), unknown routes and methods, request values FastAPI
refuses, and unexpected exceptions all answer in that shape, never in plain text or with a
traceback.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.wire.chat import HTTPError

__all__ = ["error_response", "install_error_handlers"]


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` with the JSON error object."""
    app.add_exception_handler(HTTPError, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _internal_error)
    app.add_exception_handler(StarletteHTTPException, _framework_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]


def error_response(exc: HTTPError) -> JSONResponse:
    """The answer to an :class:`HTTPError` a route raised."""
    return JSONResponse(exc.doc, status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: HTTPError) -> JSONResponse:
    return error_response(exc)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    """A bug or an unmapped failure: JSON like every other error, never a traceback."""
    METRICS.inc("agentkernel_http_requests_total", status="500")
    return JSONResponse({"error": "INTERNAL_ERROR", "message": "unexpected server error"}, 500)


_FRAMEWORK_CODES = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}


async def _framework_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """An unknown route or method, in the same JSON shape as every other error."""
    code = _FRAMEWORK_CODES.get(exc.status_code, "HTTP_ERROR")
    doc = {"error": code, "message": f"{request.method} {request.url.path}: {exc.detail}"}
    return JSONResponse(doc, exc.status_code, headers=dict(exc.headers or {}))


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A query parameter or path value FastAPI itself refused."""
    details = [{"field": ".".join(map(str, e["loc"])), "message": e["msg"]} for e in exc.errors()]
    doc = {"error": "INVALID_REQUEST", "message": "the request is invalid", "details": details}
    return JSONResponse(doc, 422)
