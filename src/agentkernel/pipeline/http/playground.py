"""The playground page (``api.playground``): ``GET /playground`` and its two static files.

One HTML page, one script and one style sheet, shipped as package data and read once per
application; nothing is fetched from elsewhere and nothing is built. The page carries no secret,
so its three paths (and ``/``, which redirects to it) are open when authentication is on; every
API call the page makes sends the credential the user typed into it, which stays in the page's
memory. It is served with a Content-Security-Policy that lets it run only its own script and
style and talk only to its own origin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response

__all__ = ["CONTENT_SECURITY_POLICY", "PAGE_PATH", "PATHS", "install"]

PAGE_PATH = "/playground"

#: Path of each static file, and its media type.
_FILES: dict[str, tuple[str, str]] = {
    PAGE_PATH: ("playground.html", "text/html; charset=utf-8"),
    PAGE_PATH + "/playground.js": ("playground.js", "text/javascript; charset=utf-8"),
    PAGE_PATH + "/playground.css": ("playground.css", "text/css; charset=utf-8"),
}

#: The paths the page needs without a credential (``/`` only redirects).
PATHS = frozenset({"/", *_FILES})

# 'self' in connect-src covers ws:// and wss:// to the same host (CSP level 3).
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return (resources.files(__package__ or __name__) / "static" / name).read_bytes()


def install(app: FastAPI) -> None:
    """Serve the page at :data:`PAGE_PATH` and redirect ``/`` to it."""
    for path, (name, media_type) in _FILES.items():
        app.get(path, include_in_schema=False)(_static(_read(name), media_type))

    async def root() -> RedirectResponse:
        return RedirectResponse(PAGE_PATH, status_code=307)

    app.get("/", include_in_schema=False)(root)


def _static(content: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
    async def serve() -> Response:
        return Response(content, media_type=media_type, headers=_HEADERS)

    return serve
