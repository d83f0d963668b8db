"""The client side of a scenario: sessions sending turns in order, and what they saw.

Each session sends its turns one after the other, the next once the previous one is answered,
each with an ``Idempotency-Key`` so that a retry after a 503, a cut connection or a draining
server is the same turn; a POST cut off without an answer is retried, and counted. A 202 or a
504 is followed by polling ``GET /api/v1/chat/{session}``.
Each reply's list must equal the prompts of the session answered so far plus its own.

With ``strategies`` on, every fourth turn of a session is sent without waiting (202) and the
next one right behind it with a multitask strategy (``interrupt``, ``rollback``, ``coalesce``,
``reject`` in turn; ``coalesce`` after two queued ones): the turns it meets may then end
``CANCELLED`` or ``SUPERSEDED``, the strategy's own turn ``SESSION_BUSY``, and a turn that
ended so must never show in a later reply (nothing of it is committed), while every other rule
holds as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.chaos.agents import POISON

POLL_SECONDS = 0.5
RETRY_SECONDS = 0.5
#: Turns a session may send while the faults go on.
MAX_TURNS = 200
SYNC_TIMEOUT = 60.0  # the product's default api.sync_timeout; a POST may wait that long
#: Answers that say "not yet" or "try again", never a turn's outcome.
TRANSIENT = {
    "TIMEOUT",
    "SHUTTING_DOWN",
    "QUEUE_UNAVAILABLE",
    "STORE_UNAVAILABLE",
    "NOT_FOUND",
    "PENDING",
}


#: The strategies paired turns use, in turn, and what each may make of the turn before it.
STRATEGIES = ("interrupt", "rollback", "coalesce", "reject")
STOPPED_BY = {
    "interrupt": frozenset({"CANCELLED"}),
    "rollback": frozenset({"CANCELLED"}),
    "coalesce": frozenset({"SUPERSEDED"}),
}


@dataclass
class Turn:
    session: str
    index: int
    prompt: str
    started: float | None = None
    answered: float | None = None
    status: int | None = None
    doc: dict[str, Any] | None = None
    posts: int = 0
    cuts: int = 0  # POSTs whose connection was dropped without an answer
    accepted: bool = False  # the IO process took it: an answer, a 202 or a 504
    problems: set[str] = field(default_factory=set)
    strategy: str | None = None  # the turn's multitask_strategy, when it sends one
    #: Error codes that are a right outcome for this turn (a strategy stopped or refused it).
    allowed: frozenset[str] = frozenset()

    @property
    def poison(self) -> bool:
        return self.prompt == POISON

    @property
    def wait(self) -> float:
        assert self.started is not None and self.answered is not None
        return self.answered - self.started


class Workload:
    """``sessions`` x ``turns`` turns against ``url``; ``poison`` puts one poison turn in.

    Each session sends at least ``turns`` turns, and goes on while the faults last (up to
    ``MAX_TURNS``), so that every fault meets traffic and each session's last turn is sent after
    the last fault; ``faults_ended`` is set when the fault script is over.

    Args:
        url: the IO process.
        sessions: concurrent sessions.
        turns: turns each session sends at least.
        tag: makes session ids unique to the run.
        poison: (session number, turn number) of the poison turn, if any.
    """

    def __init__(
        self,
        url: str,
        sessions: int,
        turns: int,
        tag: str,
        poison: tuple[int, int] | None = None,
        strategies: bool = False,
    ) -> None:
        self.url = url
        self.strategies = strategies
        self.faults_ended: float | None = None
        #: POSTs answered "try again", by error code (``QUEUE_UNAVAILABLE``, ...).
        self.refused: Counter[str] = Counter()
        self.turns = [
            [Turn(f"{tag}-s{s}", i, POISON if (s, i) == poison else f"p{i}") for i in range(turns)]
            for s in range(sessions)
        ]

    def all_turns(self) -> list[Turn]:
        return [t for session in self.turns for t in session]

    async def run(self, cap: float) -> None:
        """Drive every session until all are answered or ``cap`` seconds have passed."""
        deadline = time.monotonic() + cap
        limits = httpx.Limits(max_connections=len(self.turns) + 10)
        timeout = httpx.Timeout(SYNC_TIMEOUT + 15, connect=5)
        async with httpx.AsyncClient(base_url=self.url, limits=limits, timeout=timeout) as client:
            sessions = [self._session(client, turns, deadline) for turns in self.turns]
            # Whatever is unanswered when the cap ends is counted as such.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*sessions), cap + 1)
            await self._reread(client)

    async def _session(self, client: httpx.AsyncClient, turns: list[Turn], deadline: float) -> None:
        applied: list[str] = []
        i = 0
        while True:
            if i == len(turns):
                if not self._more(turns):
                    return
                turns.append(Turn(turns[0].session, i, f"p{i}"))
            group = self._group(turns, i)
            sent = turns[i : i + group]
            if group > 1:
                await self._pair(client, sent, deadline)
            else:
                await self._drive(client, turns[i], deadline)
            for turn in sent:
                if turn.answered is None:
                    return
                check(turn, applied)
                if turn.status == 200:
                    applied.append(turn.prompt)
            i += len(sent)

    def _group(self, turns: list[Turn], i: int) -> int:
        """How many turns from ``i`` on are sent together: 1, or with ``strategies`` on, every
        fourth turn and the one behind it with a strategy (``coalesce``: two queued behind one
        another, then the one replacing the second). Turns are added when the session has no
        more planned."""
        if not self.strategies or i % 4 != 1:
            return 1
        strategy = STRATEGIES[(i // 4 + len(turns[0].session)) % len(STRATEGIES)]
        size = 3 if strategy == "coalesce" else 2
        while len(turns) < min(i + size, MAX_TURNS):
            turns.append(Turn(turns[0].session, len(turns), f"p{len(turns)}"))
        group = turns[i : i + size]
        if len(group) < size or any(t.poison for t in group):
            return 1
        group[-1].strategy = strategy
        return size

    def _more(self, turns: list[Turn]) -> bool:
        """Whether a session that sent its turns goes on: faults still running, or not yet met."""
        ended, last = self.faults_ended, turns[-1].started
        return len(turns) < MAX_TURNS and (ended is None or last is None or last < ended)

    async def _pair(self, client: httpx.AsyncClient, group: list[Turn], deadline: float) -> None:
        """Every turn of ``group`` but the last without waiting, the last with its strategy
        right behind them, then every answer."""
        last, earlier = group[-1], group[:-1]
        assert last.strategy is not None
        for turn in earlier:
            turn.allowed = STOPPED_BY.get(last.strategy, frozenset())
        last.allowed = frozenset({"SESSION_BUSY"}) if last.strategy == "reject" else frozenset()
        ids = [await self._drive(client, turn, deadline, asynchronous=True) for turn in earlier]
        await self._drive(client, last, deadline)
        for turn, request_id in zip(earlier, ids, strict=True):
            if request_id is not None and turn.answered is None:
                await self._drive(client, turn, deadline, request_id=request_id)

    async def _drive(
        self,
        client: httpx.AsyncClient,
        turn: Turn,
        deadline: float,
        asynchronous: bool = False,
        request_id: str | None = None,
    ) -> str | None:
        """Send ``turn`` (or, with ``request_id``, poll it) until it is answered; with
        ``asynchronous``, only until it is accepted: its request id."""
        if request_id is None:
            turn.started = time.monotonic()
        while time.monotonic() < deadline:
            if request_id is None:
                turn.posts += 1
                outcome, doc = await _post(client, turn, asynchronous)
                turn.cuts += outcome == "cut"
                if outcome == "retry" and "error" in doc:
                    self.refused[str(doc["error"])] += 1
                if outcome == "poll":
                    request_id = str(doc["request_id"])
                    if asynchronous:
                        turn.accepted = True
                        return request_id
            else:
                outcome, doc = await _get(client, turn.session, request_id)
            turn.accepted |= outcome in ("poll", "final")
            if outcome == "final":
                turn.answered, turn.doc = time.monotonic(), doc
                turn.status = int(doc.pop("_status"))
                return request_id
            await asyncio.sleep(POLL_SECONDS if outcome == "poll" else RETRY_SECONDS)
        return request_id

    async def _reread(self, client: httpx.AsyncClient) -> None:
        """Read every answer again: a turn run once more after it was answered shows here."""
        gate = asyncio.Semaphore(20)

        async def reread(turn: Turn) -> None:
            assert turn.doc is not None
            async with gate:
                outcome, doc = await _get(client, turn.session, str(turn.doc["request_id"]))
            if outcome == "poll" or (
                outcome == "final" and (doc.pop("_status"), doc) != (turn.status, turn.doc)
            ):
                turn.problems.add("changed")

        answered = [t for t in self.all_turns() if t.doc is not None and t.doc.get("request_id")]
        await asyncio.gather(*(reread(t) for t in answered))


def check(turn: Turn, applied: list[str]) -> None:
    """Compare a reply's list with the prompts the session had answered before it."""
    if turn.poison:
        if turn.status is not None and turn.status < 500:
            turn.problems.add("poison answered without error")
        return
    if turn.status != 200:
        if (turn.doc or {}).get("error") not in turn.allowed:
            turn.problems.add("failed")
        return
    assert turn.doc is not None
    try:
        got = json.loads(turn.doc["result"])
    except (ValueError, KeyError, TypeError):
        turn.problems.add("garbled")
        return
    expected = [*applied, turn.prompt]
    if len(got) != len(set(got)):
        turn.problems.add("applied twice")
    if set(expected) - set(got):
        turn.problems.add("lost")
    if set(got) - set(expected):
        turn.problems.add("phantom")
    seen = list(dict.fromkeys(p for p in got if p in expected))
    if seen != [p for p in expected if p in seen]:
        turn.problems.add("out of order")


async def _post(
    client: httpx.AsyncClient, turn: Turn, asynchronous: bool = False
) -> tuple[str, dict[str, Any]]:
    body = {"session_id": turn.session, "prompt": turn.prompt, "agent": "recorder"}
    if turn.strategy is not None:
        body["multitask_strategy"] = turn.strategy
    # A connection of its own per POST: a connection dropped while the request is being answered
    # is then the server cutting off a caller (counted), never a stale pooled connection.
    headers = {"Idempotency-Key": f"turn-{turn.index}", "Connection": "close"}
    if asynchronous:
        headers["Prefer"] = "respond-async"
    try:
        response = await client.post("/api/v1/chat", json=body, headers=headers)
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
        return "cut", {}  # the server took the connection, then dropped it unanswered
    except httpx.HTTPError:
        return "retry", {}  # refused (a stopped server or none yet) or timed out
    return classify(response)


async def _get(
    client: httpx.AsyncClient, session: str, request_id: str
) -> tuple[str, dict[str, Any]]:
    try:
        response = await client.get(f"/api/v1/chat/{session}", params={"request_id": request_id})
    except httpx.HTTPError:
        return "retry", {}
    outcome, doc = classify(response)
    return ("poll", doc) if outcome == "retry" and response.status_code == 404 else (outcome, doc)


def classify(response: httpx.Response) -> tuple[str, dict[str, Any]]:
    """``final`` (the turn's outcome), ``poll`` (accepted, ask later) or ``retry``."""
    try:
        doc = response.json()
    except ValueError:
        return "retry", {}  # not a JSON answer (a bare 500 while a store is down)
    if not isinstance(doc, dict):
        return "retry", {}
    status = response.status_code
    if status in (202, 504) and "request_id" in doc:
        return "poll", doc
    if status == 200 and "result" in doc:
        return "final", {**doc, "_status": status}
    if status < 502 and doc.get("error", "NOT_FOUND") not in TRANSIENT:
        return "final", {**doc, "_status": status}  # an error reply: the turn's outcome
    return "retry", doc
