"""What a transport under the contract suite can do: declared guarantees, detected extras."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from agentkernel.pipeline.testing.foreign import UndecodableCases
from agentkernel.pipeline.transport.base import TransportConsumer
from agentkernel.pipeline.transport.blocking import AdaptedConsumer, BlockingConsumer
from agentkernel.pipeline.transport.sync_face import SyncConsumer


class Capabilities(UndecodableCases):
    """The capability flags of :class:`~agentkernel.pipeline.testing.QueueTransportContract`.

    A flag set to ``False`` removes the cases that check its capability from the subclass's
    suite (they are not collected, rather than skipped at run time).
    """

    #: Unacknowledged messages come back by themselves once their lease runs out.
    timeout_redelivery: ClassVar[bool] = True
    #: A dedup id is accepted again once the dedup window has passed.
    dedup_expiry: ClassVar[bool] = True
    #: An ack with the handle of an earlier delivery does not touch the redelivered message.
    stale_handle_inert: ClassVar[bool] = True
    #: A consumer already waiting in ``fetch`` when a group's first message is taken by another
    #: consumer does not receive that group's next message while the first is in flight.
    waiting_consumer_respects_group_lock: ClassVar[bool] = True

    # Optional capabilities: ``None`` (the default) detects them from what the transport
    # implements, as a checkpointer conformance suite does; ``True`` insists on one, ``False``
    # declares it off on purpose (its case is then removed).

    #: ``extend_lease`` keeps a message invisible past its original lease (detected: the
    #: consumer overrides ``extend_lease``; without it, it must report no ``lease_seconds``).
    lease_extension: ClassVar[bool | None] = None
    #: ``nack(message, delay_seconds)`` has the broker redeliver a message after the delay,
    #: instead of the consumer loop keeping it (and its lease) for that time (detected: a
    #: blocking consumer defines ``nack_later``, an async one ``nack``; without it, a delayed
    #: nack must answer ``False``).
    delayed_nack: ClassVar[bool | None] = None
    #: Received messages carry a ``position`` that rises within a group (replay detection;
    #: detected: the first message received has one; without it, none may have one).
    positions: ClassVar[bool | None] = None

    #: Cases that only apply when a capability is not declared off.
    _CASES_NEEDING: ClassVar[dict[str, tuple[str, ...]]] = {
        "timeout_redelivery": (
            "test_unacked_message_is_redelivered_after_lease",
            "test_stale_handle_ack_is_harmless",
            "test_lease_extension_keeps_message_hidden",
        ),
        "dedup_expiry": ("test_dedup_accepts_the_id_after_the_window",),
        "stale_handle_inert": ("test_stale_handle_ack_is_harmless",),
        "lease_extension": ("test_lease_extension_keeps_message_hidden",),
        "waiting_consumer_respects_group_lock": (
            "test_a_consumer_waiting_in_fetch_respects_the_group_lock",
        ),
        "delayed_nack": ("test_nack_with_a_delay_redelivers_after_it",),
        "positions": ("test_positions_rise_within_a_group_and_stay_on_redelivery",),
        "undecodable_kinds": (
            "test_an_undecodable_message_neither_blocks_nor_returns",
            "test_the_handling_dead_letters_an_undecodable_message_once",
        ),
    }

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        off = {
            case
            for capability, cases in cls._CASES_NEEDING.items()
            if getattr(cls, capability) in (False, ())  # None: detected when the case runs
            for case in cases
        }
        # In a fixed order (not a set's): the collection order must not depend on the hash
        # seed, or pytest-xdist's workers collect different lists and refuse to start.
        for case in dict.fromkeys(c for cases in cls._CASES_NEEDING.values() for c in cases):
            # Set on every class: a case an intermediate class removed comes back for a subclass
            # that declares its capability on (the suite itself lists no undecodable kinds).
            setattr(cls, case, None if case in off else _defined(cls, case))

    def capable(self, capability: str, consumer: Any, method: str) -> bool:
        """Whether an optional capability is on: as declared, else detected from ``method``."""
        declared: bool | None = getattr(self, capability)
        return implements(consumer, method) if declared is None else declared


def _defined(cls: type, case: str) -> object:
    """The nearest definition of ``case`` in ``cls``'s bases that is a test, not a removal."""
    return next(
        (vars(klass)[case] for klass in cls.__mro__ if vars(klass).get(case) is not None), None
    )


def implements(consumer: Any, name: str) -> bool:
    """Whether the broker consumer behind ``consumer`` (a sync face, an adapter, or the
    consumer itself) defines its own ``name`` rather than a base's default."""
    while isinstance(consumer, SyncConsumer | AdaptedConsumer):
        consumer = consumer.consumer if isinstance(consumer, SyncConsumer) else consumer.inner
    if name == "nack_later" and inspect.iscoroutinefunction(type(consumer).fetch):
        name = "nack"  # an async consumer delays through nack itself
    defined = getattr(type(consumer), name, None)
    return all(defined is not getattr(base, name, None) for base in _BASES)


_BASES = (TransportConsumer, BlockingConsumer)
