"""Tickets of accepted turns, as every front (HTTP, WebSocket, Lambda) uses them.

Before a turn is enqueued its front keeps a :class:`TurnTicket` in the response store. The ticket
lets a retry under the same ``Idempotency-Key`` with a different body be refused (422
``IDEMPOTENCY_KEY_REUSED``, as payment APIs do) instead of answered with the first body's reply,
and lets a read of a reply that is not there yet say ``PENDING`` rather than ``NOT_FOUND``.

A ticket is a convenience, not a condition: when the store cannot reach its server, the turn
still goes ahead (the outage shows up where the reply is read) and the failure is logged. A
store that is reachable but full, or that lost its data (the ticket of a retry may be among what
it lost), refuses the turn instead: its reply could never be kept, or would answer from nothing.
"""

from __future__ import annotations

import logging

from agentkernel.core.errors import StoreDataLostError, StoreError, StoreFullError
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.response_store.base import ResponseStore
from agentkernel.pipeline.wire.chat import ChatRequest, HTTPError, fingerprint
from agentkernel.pipeline.wire.records import TurnTicket

__all__ = ["RETRY_AFTER_PENDING", "admit", "known_to", "missing_reply"]

logger = logging.getLogger(__name__)
_log = RateLimitedLog(logger)

#: Seconds a client is told to wait before polling a turn that is still running again.
RETRY_AFTER_PENDING = 1


def admit(
    store: ResponseStore, chat: ChatRequest, request_id: str, owner: str | None, named: bool = True
) -> None:
    """Keep the ticket of a turn that is about to be enqueued.

    ``named=False`` says ``request_id`` was drawn at random for this turn (no Idempotency-Key):
    no retry can send it again, so its ticket keeps no fingerprint and none is computed.

    Raises:
        HTTPError: 422 ``IDEMPOTENCY_KEY_REUSED`` when ``request_id`` was accepted before for
            different content (another prompt, agent or session).
        StoreFullError: the store refuses writes.
        StoreDataLostError: the store lost its data.
    """
    ticket = TurnTicket(request_id, chat.session_id, fingerprint(chat) if named else "", owner)
    try:
        kept = store.accept(ticket)
    except (StoreFullError, StoreDataLostError):
        raise
    except StoreError as exc:
        _log.log(
            logging.WARNING,
            f"ticket:{type(exc).__name__}",
            "no ticket kept for request %s (the turn goes on): %s",
            request_id,
            exc,
        )
        return
    if kept is not None and kept.fingerprint != ticket.fingerprint:
        raise HTTPError(
            422,
            "IDEMPOTENCY_KEY_REUSED",
            "this idempotency key was already used for a different request; send a new key",
            request_id=request_id,
            session_id=chat.session_id,
        )


def missing_reply(
    store: ResponseStore, session_id: str, request_id: str, owner: str | None
) -> HTTPError:
    """The 404 for a reply that is not in the store: ``PENDING`` (with ``Retry-After``) when
    this caller's turn was accepted and has not answered yet, ``NOT_FOUND`` otherwise.

    Raises:
        StoreError: the store could not be read.
    """
    ticket = store.ticket(request_id)
    if ticket is not None and ticket.visible_to(session_id, owner):
        return HTTPError(
            404,
            "PENDING",
            "the turn was accepted and has not answered yet; poll again",
            {"Retry-After": str(RETRY_AFTER_PENDING)},
            request_id=request_id,
            session_id=session_id,
        )
    return HTTPError(
        404,
        "NOT_FOUND",
        "no reply for this request in this session",
        request_id=request_id,
        session_id=session_id,
    )


def known_to(store: ResponseStore, session_id: str, request_id: str, owner: str | None) -> bool:
    """Whether ``owner`` may see turn ``request_id`` under ``session_id`` at all: its ticket or
    its reply says so (a stream checks this before its first byte). A turn that neither shows
    is unknown, except to a caller without identity on a store that keeps no tickets.

    Raises:
        StoreError: the store could not be read.
    """
    ticket = store.ticket(request_id)
    if ticket is not None:
        return ticket.visible_to(session_id, owner)
    record = store.get(request_id)
    if record is not None:
        return record.visible_to(session_id, owner)
    return owner is None and not store.keeps_tickets
