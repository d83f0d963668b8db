"""Where a delivered message sits in its broker's own order, and what that says about replays.

Every broker numbers the messages of one ordering unit monotonically: a Kafka partition (the
offset), a JetStream stream (the stream sequence), an SQS FIFO queue (``SequenceNumber``, rising
within each message group), the in-memory broker (a counter of its own). A session's turns all
travel through one unit and are delivered one at a time in that order, so once a turn at
sequence ``n`` of a unit is committed, every earlier message of the session in that unit has
already been handled: a delivery at or below ``n`` is a replay, however many turns came after.

The unit names the broker object *and its incarnation* (a stream's creation time, a topic's id,
the in-memory broker's random id), because a recreated stream or topic starts numbering again
from the start. Positions of different units are never compared. Where the broker also says
when it stored a message (JetStream), the position carries that time: a process that has not
yet seen a stream declared again stamps the new stream's messages with the old unit, and a
message stored after the applied one is then never taken for an earlier one, whatever its
sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Position:
    """A message's place in its ordering unit.

    Attributes:
        unit: names the ordering unit and its incarnation, e.g.
            ``kafka:agent-input[3]@<topic id>`` or ``nats:AK_INPUT@<created>``.
        sequence: the broker's monotonic number of the message within ``unit``.
        stored: when the broker stored the message (epoch seconds), where it says so.
    """

    unit: str
    sequence: int
    stored: float | None = None

    def covers(self, other: Position | None) -> bool:
        """Whether ``other`` is this position or an earlier one of the same unit."""
        return other is not None and other.unit == self.unit and not self._before(other)

    def later(self, other: Position | None) -> Position:
        """This position, unless ``other`` is a later one of the same unit."""
        if other is not None and other.unit == self.unit and self._before(other):
            return other
        return self

    def _before(self, other: Position) -> bool:
        """Whether ``other`` (of the same unit) comes after this position: stored later where
        both say when (a stream declared again numbers from 1 again), else a higher sequence."""
        if self.stored is not None and other.stored is not None and other.stored != self.stored:
            return other.stored > self.stored
        return other.sequence > self.sequence

    def to_doc(self) -> dict[str, Any]:
        """The JSON form kept in a session record."""
        doc: dict[str, Any] = {"unit": self.unit, "seq": self.sequence}
        if self.stored is not None:
            doc["at"] = self.stored
        return doc

    @classmethod
    def from_doc(cls, doc: Any) -> Position | None:
        """The position stored as ``doc``; ``None`` for a missing or malformed one."""
        if not isinstance(doc, dict):
            return None
        unit, seq, at = doc.get("unit"), doc.get("seq"), doc.get("at")
        if not isinstance(unit, str) or not isinstance(seq, int) or isinstance(seq, bool):
            return None
        stored = float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None
        return cls(unit, seq, stored)
