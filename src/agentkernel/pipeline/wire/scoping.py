"""Sessions scoped by identity: the key a session is stored and queued under.

A client names its session (``session_id``); with authentication on, the session it means is its
own. Two identities that both say ``s1`` talk in two different sessions, so nobody can learn
whether another identity's session exists, nor take a session id another identity will use.

The key is ``<digest of the identity>/<session_id>``. A client's session id never contains
``/`` (it is a URL path segment), so no turn sent without an identity can address a scoped key.
Agents still see the ``session_id`` the client sent (``Turn.session_id``) and the key as
``Turn.session_key``, the one to key any storage of their own by.
"""

from __future__ import annotations

import hashlib

__all__ = ["owner_scope", "session_key"]


def session_key(session_id: str, owner: str | None) -> str:
    """Where the session ``session_id`` of ``owner`` lives: the session store key and the INPUT
    message group. ``session_id`` itself for a turn without an identity."""
    if owner is None:
        return session_id
    return f"{owner_scope(owner)}/{session_id}"


def owner_scope(owner: str) -> str:
    """The digest of ``owner`` that prefixes the keys of its sessions (32 hex digits)."""
    return hashlib.sha256(owner.encode()).hexdigest()[:32]
