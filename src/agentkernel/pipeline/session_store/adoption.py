"""Sessions stored before sessions were scoped per identity, adopted by their owner on first use.

Before scoping, a session lived under the id its client chose (``s1``) and its record named the
owner by the bare user id of the credential (``alice``, from an API key, a JWT ``sub`` or an API
Gateway authorizer alike). Now the same client's session lives under ``<digest>/s1``
(:func:`~agentkernel.pipeline.wire.scoping.session_key`) and its owner is a qualified identity
(``key:alice``, ``jwt:<issuer>:alice``; :func:`~agentkernel.auth.qualified_identity`), so after
an upgrade every session would start afresh.

``session.adopt_unscoped`` lists the identity schemes (``key``) or schemes and issuers
(``jwt:https%3A//idp.example/``, written as in identities) whose users' old sessions may be
adopted. When a turn of such an identity finds no scoped record, the unscoped record of its
session id is read; if that record's owner is the identity's user id, it is claimed and copied:

1. the unscoped record is marked ``adopted_by`` the identity (a conditional write on its version,
   so of two identities racing for it one wins), which stops every other identity from adopting
   it later; its owner stays, so a turn without an identity still cannot use it;
2. a copy owned by the identity is written under the scoped key (a conditional write on version
   0), and the turn continues the session. Should this write not happen (a crash between the
   two), the same identity's next turn adopts the marked record again.

A record without an owner (written with authentication off), or owned by another user id, or
already claimed by another identity, is never adopted: the turn starts a new session, as without
the setting. The claimed unscoped record expires with the store's TTL; by then no record older
than the upgrade is left, and the setting can go.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from urllib.parse import unquote

from agentkernel.core.errors import StaleSessionError
from agentkernel.pipeline.session_store.base import SessionRecord, SessionStore

__all__ = ["UnscopedAdoption"]

#: Conditional writes tried before the turn goes on with what the store holds.
_ATTEMPTS = 4


class UnscopedAdoption:
    """Reads a turn's session, adopting its unscoped record when ``schemes`` allow it.

    Args:
        store: the session store.
        schemes: ``session.adopt_unscoped``; empty adopts nothing.
    """

    def __init__(self, store: SessionStore, schemes: Sequence[str]) -> None:
        self.store = store
        self.schemes = frozenset(schemes)

    def read(self, key: str, session_id: str, identity: str | None) -> SessionRecord:
        """The record of the session stored under ``key`` (blocking), adopted from the unscoped
        record of ``session_id`` when it has none and the unscoped one is ``identity``'s.

        Raises:
            SessionStoreError: the store failed.
        """
        record = self.store.read(key)
        if record.version or identity is None or key == session_id:
            return record
        user = self.legacy_user(identity)
        if user is None:
            return record
        for _ in range(_ATTEMPTS):
            old = self.store.read(session_id)
            if not _adoptable(old, user, identity):
                return record  # none, ownerless, someone else's, or adopted by another
            try:
                return self._adopt(key, session_id, identity, old)
            except StaleSessionError:
                record = self.store.read(key)  # raced: by another turn, or for the claim
                if record.version:
                    return record
        return record

    def legacy_user(self, identity: str) -> str | None:
        """The bare user id an unscoped record of ``identity`` names as its owner, or ``None``
        when ``identity``'s scheme (and issuer) is not listed."""
        parts = identity.split(":")  # ':' is escaped in every part of an identity
        if len(parts) not in (2, 3) or not all(parts):  # scheme[:issuer]:user, none empty
            return None
        *qualifier, user = parts
        if qualifier[0] in self.schemes or ":".join(qualifier) in self.schemes:
            return unquote(user)
        return None

    def _adopt(self, key: str, session_id: str, identity: str, old: SessionRecord) -> SessionRecord:
        if old.adopted_by is None:
            claim = dataclasses.replace(old, adopted_by=identity, version=old.version + 1)
            self.store.write(session_id, claim, expected_version=old.version)
        copy = dataclasses.replace(
            old, owner=identity, adopted_by=None, trial=None, version=old.version + 1
        )
        self.store.write(key, copy, expected_version=0)
        return copy


def _adoptable(old: SessionRecord, user: str, identity: str) -> bool:
    """Whether ``identity`` (whose bare user id is ``user``) may adopt the unscoped ``old``."""
    if old.version == 0 or old.owner != user:
        return False
    return old.adopted_by is None or old.adopted_by == identity
