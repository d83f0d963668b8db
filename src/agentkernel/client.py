"""A small HTTP client for a running agentkernel server (used by ``agentkernel chat``)."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from typing import IO, Any
from urllib.parse import quote

import httpx

#: Seconds to wait for the server to say whether it has a turn whose answer timed out.
RECHECK_SECONDS = 5.0


class ChatError(Exception):
    """The server answered a turn with an error (or could not be reached)."""


class ChatClient:
    """Sends chat turns to ``base_url``.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000``.
        timeout: seconds to wait for a reply, in all (the POST and any polling after it).
        api_key: sent as ``X-API-Key`` when the server has authentication on.
        token: sent as ``Authorization: Bearer`` (a JWT) when the server has authentication on.
    """

    def __init__(
        self,
        base_url: str,
        timeout: float = 60.0,
        api_key: str | None = None,
        token: str | None = None,
    ) -> None:
        self.timeout = timeout
        headers = {"X-API-Key": api_key} if api_key else {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.base_url = base_url
        self._http = httpx.Client(base_url=base_url, timeout=timeout, headers=headers)

    def close(self) -> None:
        self._http.close()

    def ask(
        self,
        session: str,
        prompt: str,
        agent: str | None = None,
        asynchronous: bool = False,
        **extra: Any,
    ) -> str:
        """Send a turn and return the reply text (polling when the server answers 202 or 504),
        or raise :class:`ChatError` once ``timeout`` seconds have passed without one.

        ``extra`` fields travel in the body and reach the agent as ``turn.extra``.
        """
        deadline = time.monotonic() + self.timeout
        # A key of our own: if no answer comes in time, asking again with it (which never runs
        # the turn twice) tells us the turn's request id, so we can say where to poll.
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        if asynchronous:
            headers["Prefer"] = "respond-async"
        body = self._body(session, prompt, agent) | extra
        try:
            response = self._post(body, headers)
        except httpx.TimeoutException as exc:
            raise ChatError(self._no_reply(session, body, headers)) from exc
        doc = _json(response)
        if response.status_code in (202, 504) and "request_id" in doc:
            # Queued (async), or not answered within the server's wait: poll until our deadline.
            response = self._poll(session, doc["request_id"], deadline)
            doc = _json(response)
        if response.status_code == 200 and "result" in doc:
            return str(doc["result"])
        if doc.get("error") == "PENDING":
            raise ChatError(self._still_running(session, str(doc.get("request_id", ""))))
        raise ChatError(f"HTTP {response.status_code}: {json.dumps(doc)}")

    def _still_running(self, session: str, request_id: str) -> str:
        return (
            f"no reply within {self.timeout:g}s; the turn is still running: poll "
            f"{self.base_url.rstrip('/')}/api/v1/chat/{quote(session, safe='')}"
            f"?request_id={request_id}"
        )

    def _no_reply(self, session: str, body: dict[str, Any], headers: dict[str, str]) -> str:
        """The message for a POST not answered in time: with the URL to poll when the server
        says (asked again with the same key, answering at once) that it has the turn."""
        try:
            response = self._http.post(
                "/api/v1/chat",
                json=body,
                headers=headers | {"Prefer": "respond-async"},
                timeout=RECHECK_SECONDS,
            )
            request_id = response.json().get("request_id") if response.status_code == 202 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            request_id = None
        if request_id:
            return self._still_running(session, str(request_id))
        return f"no reply within {self.timeout:g}s from {self.base_url}"

    def stream(
        self, session: str, prompt: str, agent: str | None = None, **extra: Any
    ) -> Iterator[str]:
        """Send a turn and yield the reply's text chunks as the agent produces them."""
        headers = {"Accept": "text/event-stream"}
        body = self._body(session, prompt, agent) | extra
        request_id = ""
        try:
            with self._http.stream("POST", "/api/v1/chat", json=body, headers=headers) as r:
                if r.status_code != 200:
                    raise ChatError(f"HTTP {r.status_code}: {r.read().decode(errors='replace')}")
                request_id = r.headers.get("x-request-id", "")
                yield from _deltas(r.iter_lines())
        except httpx.TimeoutException as exc:
            if request_id:  # the server took the turn, then said nothing for too long
                raise ChatError(self._still_running(session, request_id)) from exc
            raise ChatError(f"no reply within {self.timeout:g}s from {self.base_url}") from exc
        except httpx.HTTPError as exc:
            raise ChatError(self._unreachable(exc)) from exc

    def cancel(self, session: str, request_id: str) -> str:
        """Cancel turn ``request_id`` of ``session``; a line saying how it ended.

        Raises:
            ChatError: the turn is unknown (or another identity's), had already answered, or
                the server could not be reached or cannot cancel.
        """
        path = f"/api/v1/chat/{quote(session, safe='')}/cancel"
        try:
            response = self._http.post(path, params={"request_id": request_id})
        except httpx.HTTPError as exc:
            raise ChatError(self._unreachable(exc)) from exc
        doc = _json(response)
        if response.status_code == 200:
            return f"{doc.get('status', 'CANCELLED').lower()}: {request_id}"
        if response.status_code == 202:
            return f"cancel requested: {request_id} has not answered yet; poll it for CANCELLED"
        raise ChatError(f"{doc.get('error', response.status_code)}: {doc.get('message', '')}")

    def _unreachable(self, exc: httpx.HTTPError) -> str:
        return f"cannot reach the server at {self.base_url}: {exc}"

    @staticmethod
    def _body(session: str, prompt: str, agent: str | None) -> dict[str, Any]:
        return {"session_id": session, "prompt": prompt} | ({"agent": agent} if agent else {})

    def _post(self, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        try:
            return self._http.post("/api/v1/chat", json=body, headers=headers)
        except httpx.TimeoutException:
            raise  # the caller knows whether the turn may have been taken
        except httpx.HTTPError as exc:
            raise ChatError(self._unreachable(exc)) from exc

    def _poll(self, session: str, request_id: str, deadline: float) -> httpx.Response:
        path = f"/api/v1/chat/{quote(session, safe='')}"
        while True:
            remaining = deadline - time.monotonic()
            try:
                response = self._http.get(
                    path, params={"request_id": request_id}, timeout=max(remaining, 0.1)
                )
            except httpx.TimeoutException as exc:
                raise ChatError(self._still_running(session, request_id)) from exc
            except httpx.HTTPError as exc:
                raise ChatError(self._unreachable(exc)) from exc
            if response.status_code not in (404, 503) or remaining <= 0.2:
                return response
            time.sleep(0.2)


def _deltas(lines: Iterator[str]) -> Iterator[str]:
    """The text chunks of an event stream, until its last frame (an error frame raises)."""
    for line in lines:
        if not line.startswith("data: "):
            continue
        frame = json.loads(line[6:])
        if frame.get("done"):
            if "error" in frame:
                raise ChatError(f"{frame['error']}: {frame.get('message', '')}")
            return
        yield str(frame.get("delta", ""))


def _json(response: httpx.Response) -> dict[str, Any]:
    """The answer's JSON object; anything else (a proxy's HTML page, a redirect) is an error."""
    try:
        doc = response.json()
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        text = response.text[:200] or "(empty body)"
        raise ChatError(f"HTTP {response.status_code}: not a JSON answer: {text}")
    return doc


def one_turn(
    client: ChatClient,
    session: str,
    prompt: str,
    agent: str | None,
    *,
    stream: bool,
    asynchronous: bool,
    out: IO[str] = sys.stdout,
    **extra: Any,
) -> None:
    """Send one turn and print its reply (chunk by chunk when streaming); ``extra`` fields
    travel in the body (``multitask_strategy``, or fields for the agent)."""
    if stream:
        for delta in client.stream(session, prompt, agent, **extra):
            out.write(delta)
            out.flush()
        out.write("\n")
    else:
        out.write(client.ask(session, prompt, agent, asynchronous, **extra) + "\n")
    out.flush()


def interactive(
    client: ChatClient,
    session: str,
    agent: str | None,
    *,
    stream: bool,
    lines: IO[str] = sys.stdin,
    out: IO[str] = sys.stdout,
    **extra: Any,
) -> None:
    """Read a line, send it, print the reply, repeat until end of input (or an empty ``/quit``)."""
    for line in lines:
        prompt = line.strip()
        if prompt in ("/quit", "/exit"):
            return
        if not prompt:
            continue
        try:
            one_turn(
                client, session, prompt, agent, stream=stream, asynchronous=False, out=out, **extra
            )
        except ChatError as exc:
            print(f"error: {exc}", file=sys.stderr)
