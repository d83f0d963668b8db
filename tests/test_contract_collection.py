"""Which contract cases a transport's suite collects: a capability declared off removes its
cases; one declared on, or listed kinds, keep them, whatever an intermediate class declared."""

from __future__ import annotations

import inspect

from agentkernel.pipeline.testing import QueueTransportContract

UNDECODABLE = (
    "test_an_undecodable_message_neither_blocks_nor_returns",
    "test_the_handling_dead_letters_an_undecodable_message_once",
)


def collected(cls: type, case: str) -> bool:
    return inspect.isfunction(getattr(cls, case))


def test_listed_undecodable_kinds_bring_their_cases_although_the_base_lists_none() -> None:
    class WithKinds(QueueTransportContract):
        undecodable_kinds = ("garbage",)

    assert not any(collected(QueueTransportContract, case) for case in UNDECODABLE)
    assert all(collected(WithKinds, case) for case in UNDECODABLE)


def test_a_capability_declared_off_removes_its_cases_and_a_subclass_can_turn_it_back_on() -> None:
    class NoTimer(QueueTransportContract):
        timeout_redelivery = False

    class TimerAgain(NoTimer):
        timeout_redelivery = True

    case = "test_unacked_message_is_redelivered_after_lease"
    assert collected(QueueTransportContract, case)
    assert not collected(NoTimer, case)
    assert collected(TimerAgain, case)


def test_a_case_needing_two_capabilities_stays_removed_when_either_is_off() -> None:
    class StaleHandlesCount(QueueTransportContract):
        stale_handle_inert = False  # timeout_redelivery stays on

    assert not collected(StaleHandlesCount, "test_stale_handle_ack_is_harmless")
    assert collected(StaleHandlesCount, "test_unacked_message_is_redelivered_after_lease")
