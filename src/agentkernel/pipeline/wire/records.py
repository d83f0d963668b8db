"""Reply records and turn tickets as stores keep them, and the one rule of who may read them.

Every response store writes and reads a reply (:class:`ResponseRecord`) and a turn's ticket
(:class:`TurnTicket`) through ``to_json``/``from_json`` here; :func:`visible` is the check every
read applies; the session index periods say where a shared store lists a session's turns.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

#: Length of the periods a shared store's session index is kept in, seconds. Fixed rather than
#: the store's ``ttl``, so processes whose ``ttl`` differs (a configuration being rolled out)
#: name the same periods.
INDEX_PERIOD_SECONDS = 3600


def index_period() -> int:
    """The number of the :data:`INDEX_PERIOD_SECONDS`-long period of wall-clock time now is in.

    A shared store indexes a session's request ids per period (one set per period, expiring
    with its entries), so that a busy session does not grow one set for ever. An erase reads
    :func:`index_periods`.
    """
    return math.floor(time.time() / INDEX_PERIOD_SECONDS)


def index_periods(ttl: float) -> range:
    """The periods whose index can name a turn whose entries, kept ``ttl`` seconds, still live:
    back to the one ``ttl`` ago (an id indexed before it expired with its entries) and the next
    one (another process's clock ahead of this one's)."""
    now = index_period()
    return range(now - math.ceil(ttl / INDEX_PERIOD_SECONDS), now + 2)


def visible(session_id: str, owner: str | None, to_session: str, to_owner: str | None) -> bool:
    """The one rule for every read of a turn (reply, ticket, stream, WebSocket, Lambda): a turn
    of ``session_id`` sent by ``owner`` is visible under ``to_session`` to ``to_owner`` only when
    the sessions are the same and the turn has no owner or the same one. Compared in constant
    time, so the time of an answer says nothing about how much of an id was right."""
    if not secrets.compare_digest(session_id.encode(), to_session.encode()):
        return False
    if owner is None:
        return True
    return to_owner is not None and secrets.compare_digest(owner.encode(), to_owner.encode())


@dataclass(frozen=True)
class ResponseRecord:
    """A stored reply.

    Attributes:
        request_id: the turn's id (the key).
        session_id: the session the turn belongs to; reads under another session are refused.
        status_code: HTTP status the reply maps to (200, or the error's status).
        body: the reply document.
        owner: identity that sent the turn, when authentication is on.
    """

    request_id: str
    session_id: str
    status_code: int
    body: dict[str, Any] = field(default_factory=dict)
    owner: str | None = None

    def visible_to(self, session_id: str, owner: str | None) -> bool:
        """Whether ``owner`` asking under ``session_id`` may see this (see :func:`visible`)."""
        return visible(self.session_id, self.owner, session_id, owner)

    def to_json(self) -> str:
        # Not asdict(): it deep-copies the body only to have it encoded.
        doc = {
            "request_id": self.request_id,
            "session_id": self.session_id,
            "status_code": self.status_code,
            "body": self.body,
            "owner": self.owner,
        }
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str | bytes) -> ResponseRecord:
        data = json.loads(text)
        return cls(
            request_id=str(data["request_id"]),
            session_id=str(data["session_id"]),
            status_code=int(data.get("status_code", 200)),
            body=dict(data.get("body") or {}),
            owner=data.get("owner"),
        )


@dataclass(frozen=True)
class TurnTicket:
    """What a front knew when it accepted a turn, kept beside the reply under the same TTL.

    It lets a read tell a turn that is still running (``PENDING``) from one nobody sent, and a
    retry with the same ``Idempotency-Key`` but another body be refused instead of answered with
    the first body's reply.

    Attributes:
        request_id: the turn's id (the key).
        session_id: the session the turn belongs to.
        fingerprint: digest of the turn's content
            (:func:`agentkernel.pipeline.wire.chat.fingerprint`);
            empty for a turn whose id was drawn at random, which no retry can name.
        owner: identity that sent the turn, when authentication is on.
    """

    request_id: str
    session_id: str
    fingerprint: str
    owner: str | None = None

    def visible_to(self, session_id: str, owner: str | None) -> bool:
        """Whether ``owner`` asking under ``session_id`` may see this (see :func:`visible`)."""
        return visible(self.session_id, self.owner, session_id, owner)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> TurnTicket:
        data = json.loads(text)
        return cls(
            request_id=str(data["request_id"]),
            session_id=str(data["session_id"]),
            fingerprint=str(data["fingerprint"]),
            owner=data.get("owner"),
        )
