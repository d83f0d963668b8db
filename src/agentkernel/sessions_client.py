"""A small HTTP client for the sessions API of a running server (``agentkernel sessions``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from agentkernel.client import ChatError

__all__ = ["SessionsClient"]

#: The sessions routes (as :data:`agentkernel.pipeline.front.sessions.SESSIONS_PATH`; not imported,
#: so the client loads nothing of the server).
SESSIONS_PATH = "/api/v1/sessions"


class SessionsClient:
    """Lists, shows and erases the caller's sessions on ``base_url``.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000``.
        timeout: seconds to wait for each answer.
        api_key: sent as ``X-API-Key`` when the server has authentication on.
        token: sent as ``Authorization: Bearer`` (a JWT) when the server has authentication on.

    Every method raises :class:`~agentkernel.client.ChatError` when the server cannot be
    reached or answers with an error (its status, code and message in the text).
    """

    def __init__(
        self,
        base_url: str,
        timeout: float = 30.0,
        api_key: str | None = None,
        token: str | None = None,
    ) -> None:
        headers = {"X-API-Key": api_key} if api_key else {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=base_url, timeout=timeout, headers=headers)

    def close(self) -> None:
        self._http.close()

    def list(self, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        """One page: ``{"sessions": [{session_id, last_activity_at}], "next_cursor": ...}``."""
        params: dict[str, str] = {}
        if limit is not None:
            params["limit"] = str(limit)
        if cursor:
            params["cursor"] = cursor
        return self._json(self._call("GET", SESSIONS_PATH, params))

    def show(self, session_id: str) -> dict[str, Any]:
        """The session: ``state``, ``turns`` (newest first), ``last_reply``."""
        return self._json(self._call("GET", _one(session_id)))

    def delete(self, session_id: str) -> None:
        """Erase the session everywhere (the server answers 204 whether or not it existed)."""
        self._call("DELETE", _one(session_id))

    def _call(self, method: str, path: str, params: dict[str, str] | None = None) -> httpx.Response:
        try:
            response = self._http.request(method, path, params=params)
        except httpx.HTTPError as exc:
            raise ChatError(f"cannot reach the server: {exc}") from exc
        if response.status_code >= 400:
            raise ChatError(_error_text(response))
        return response

    @staticmethod
    def _json(response: httpx.Response) -> dict[str, Any]:
        try:
            doc = response.json()
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise ChatError(f"HTTP {response.status_code}: not a JSON answer")
        return doc


def _one(session_id: str) -> str:
    return f"{SESSIONS_PATH}/{quote(session_id, safe='')}"


def _error_text(response: httpx.Response) -> str:
    try:
        doc = response.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "error" in doc:
        return f"HTTP {response.status_code} {doc['error']}: {doc.get('message', '')}"
    return f"HTTP {response.status_code}: {response.text[:200] or '(empty body)'}"
