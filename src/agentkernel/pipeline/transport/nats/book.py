"""The messages of one owned partition, kept per session in stream order.

The owner pulls up to ``max_ack_pending`` messages of a partition; a session's message is
handed out only when every earlier message of that session is settled, so each session has
one turn in flight while the partition's other sessions proceed. An entry is in one state:

- ``remote``: pending in the stream but delivered before this consumer owned the partition
  (to a former owner, which may still run it): found by :meth:`Book.blocker` when the
  partition is taken over, it holds its session's later messages until it is delivered here
  or is gone from the stream (acked by whoever had it);
- ``ready``: delivered here and not handed out; its lease is kept alive while it waits;
- ``inflight``: handed out, not settled;
- ``away``: given back (nak) by this consumer; it comes back here, as redeliveries do.

A settled entry is removed; the session's next entry becomes its head.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

REMOTE, READY, INFLIGHT, AWAY = "remote", "ready", "inflight", "away"


@dataclass(eq=False)
class Entry:
    seq: int
    session: str
    state: str
    msg: Any = None
    delivery: int = 0  # the delivery count of ``msg``
    touched: float = 0.0  # loop time its lease last restarted (delivery or in-progress)
    since: float = 0.0  # loop time it entered its state


def session_key(group: str | None, seq: int) -> str:
    """What a message is ordered by: its session, or a key of its own without one."""
    return f"\0{seq}" if group is None else group


class Book:
    """One owned partition's unsettled messages (see the module docstring)."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.entries: dict[int, Entry] = {}
        self._sessions: dict[str, list[int]] = {}
        self._runnable: dict[str, None] = {}  # sessions whose head is ready (insertion order)

    def blocker(self, seq: int, session: str, now: float) -> None:
        """A message pending in the stream that a former owner was delivered."""
        if seq not in self.entries:
            self._add(Entry(seq, session, REMOTE, since=now))

    def receive(self, msg: Any, seq: int, session: str, delivery: int, now: float) -> Entry:
        """A delivery arrived: a new entry, or the redelivery of a known one."""
        entry = self.entries.get(seq)
        if entry is None:
            entry = Entry(seq, session, READY)
            self._add(entry)
        entry.msg, entry.delivery, entry.touched, entry.since = msg, delivery, now, now
        entry.state = READY
        self._update(entry.session)
        return entry

    def take(self, limit: int, now: float) -> list[Entry]:
        """Up to ``limit`` runnable heads, now in flight."""
        out: list[Entry] = []
        for session in list(self._runnable):
            if len(out) >= limit:
                break
            entry = self.entries[self._sessions[session][0]]
            entry.state, entry.since = INFLIGHT, now
            del self._runnable[session]
            out.append(entry)
        return out

    def settle(self, seq: int, delivery: int) -> bool:
        """The delivery was acked or terminated: remove it. ``False``: a stale handle (another
        delivery of it is current) or an unknown message, left alone."""
        entry = self.entries.get(seq)
        if entry is None or entry.delivery != delivery:
            return False
        self.remove(seq)
        return True

    def give_back(self, seq: int, delivery: int, now: float) -> bool:
        """The delivery was nacked: its session waits for it to come back."""
        entry = self.entries.get(seq)
        if entry is None or entry.delivery != delivery:
            return False
        entry.state, entry.since = AWAY, now
        self._update(entry.session)
        return True

    def remove(self, seq: int) -> None:
        entry = self.entries.pop(seq, None)
        if entry is None:
            return
        seqs = self._sessions[entry.session]
        seqs.remove(seq)
        if not seqs:
            del self._sessions[entry.session]
            self._runnable.pop(entry.session, None)
        else:
            self._update(entry.session)

    def waiting(self) -> Iterator[Entry]:
        """Entries delivered here and not handed out (their leases are kept alive)."""
        return (e for e in self.entries.values() if e.state == READY)

    def stuck(self) -> list[Entry]:
        """Heads not delivered here (``remote`` or ``away``) that hold a ready message back:
        each is checked against the stream, where a settled message is gone."""
        out = []
        for seqs in self._sessions.values():
            head = self.entries[seqs[0]]
            if head.state in (REMOTE, AWAY) and any(
                self.entries[s].state == READY for s in seqs[1:]
            ):
                out.append(head)
        return out

    @property
    def runnable(self) -> int:
        return len(self._runnable)

    def _add(self, entry: Entry) -> None:
        self.entries[entry.seq] = entry
        bisect.insort(self._sessions.setdefault(entry.session, []), entry.seq)
        self._update(entry.session)

    def _update(self, session: str) -> None:
        seqs = self._sessions.get(session)
        if seqs and self.entries[seqs[0]].state == READY:
            self._runnable.setdefault(session, None)
        else:
            self._runnable.pop(session, None)
