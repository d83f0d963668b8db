"""Turn signals in DynamoDB (moto) pass the contract, and leave no item behind."""

from __future__ import annotations

import json
import time
import uuid

import boto3
import pytest
from tests.stores.test_session_stores import create_session_table

from agentkernel.core.errors import SessionStoreUnavailableError
from agentkernel.pipeline.session_store.dynamodb import DynamoDBSessionStore
from agentkernel.pipeline.turn_control import Stop, StopKind, TurnSignals
from agentkernel.pipeline.turn_control.signals_dynamodb import DynamoDBTurnSignals
from agentkernel.pipeline.turn_control.testing import TurnSignalsContract

pytestmark = pytest.mark.aws


class TestDynamoDBTurnSignals(TurnSignalsContract):
    @pytest.fixture(autouse=True)
    def _server(self, aws: str) -> None:
        self.table = f"sessions-{uuid.uuid4().hex[:8]}"
        create_session_table(self.table)
        self.client = boto3.client("dynamodb")

    def make_signals(self, ttl: float = 60.0, stale_after: float = 60.0) -> TurnSignals:
        return DynamoDBTurnSignals(self.client, self.table, ttl=ttl, stale_after=stale_after)

    def items(self) -> list[dict[str, object]]:
        return list(self.client.scan(TableName=self.table)["Items"])

    def test_the_session_store_keeps_its_signals_in_its_table(self) -> None:
        signals = DynamoDBSessionStore(self.table).turn_signals(stale_after=30.0)
        assert isinstance(signals, DynamoDBTurnSignals) and signals.stale_after == 30.0
        signals.open("s", "r1")
        assert (
            [json.dumps(item) for item in self.items()]
            == [json.dumps(item) for item in self.items() if "signals/open/s" in json.dumps(item)]
            != []
        )

    def test_every_item_carries_the_ttl_attribute(self) -> None:
        signals = self.make_signals(ttl=50.0, stale_after=20.0)
        signals.open("s", "queued")
        signals.start("s", "running")
        signals.stop("s", "stopped", Stop(StopKind.CANCEL))
        expiries = {i["session_id"]["S"]: float(i["expiry_time"]["N"]) for i in self.items()}
        left = {key: at - time.time() for key, at in expiries.items()}
        assert len(left) == 3, left
        assert 10 < left["signals/open/s"] <= 21
        assert 10 < left["signals/turn/running"] <= 21
        assert 40 < left["signals/turn/stopped"] <= 51

    def test_closed_turns_and_forgotten_sessions_leave_nothing_but_an_expiring_item(self) -> None:
        signals = self.make_signals()
        signals.open("s", "a")
        signals.start("s", "a")
        signals.stop("s", "a", Stop(StopKind.CANCEL))
        signals.close("s", "a")
        left = self.items()
        assert [i["session_id"]["S"] for i in left] == ["signals/open/s"]
        assert not [name for name in left[0] if name.startswith("o:")]
        signals.forget_session("s")
        signals.open("t", "b")
        signals.stop("t", "b", Stop(StopKind.ROLLBACK, by="c"))
        signals.start("t", "d")
        signals.forget_session("t")
        assert self.items() == []

    def test_stale_entries_are_removed_from_the_session_item(self) -> None:
        signals = self.make_signals(stale_after=0.5)
        for exclusive in (False, True):
            key = f"s-{exclusive}"
            signals.open(key, "lost")
            time.sleep(0.6)
            assert signals.open(key, "next", exclusive=exclusive) == []
            item = self.client.get_item(
                TableName=self.table, Key={"session_id": {"S": f"signals/open/{key}"}}
            )["Item"]
            assert sorted(name for name in item if name.startswith("o:")) == ["o:next"]

    def test_stops_reads_more_turns_than_one_batch_takes(self) -> None:
        signals = self.make_signals()
        ids = [f"r{i}" for i in range(250)]
        for rid in ids[::50]:
            signals.stop("s", rid, Stop(StopKind.CANCEL))
        assert signals.stops([*ids, *ids]) == {rid: Stop(StopKind.CANCEL) for rid in ids[::50]}
        signals.forget_session("s")

    def test_an_unreachable_endpoint_is_an_outage(self) -> None:
        from botocore.config import Config

        client = boto3.client(
            "dynamodb",
            endpoint_url="http://127.0.0.1:1",
            config=Config(retries={"max_attempts": 1}, connect_timeout=1),
        )
        signals = DynamoDBTurnSignals(client, self.table)
        with pytest.raises(SessionStoreUnavailableError, match="start of turn r"):
            signals.start("s", "r")
