"""Consumers written to upstream's guide (class methods over raw SQS records) run here: an ECS
entry file under ``run()``, a Lambda handler under ``handle``, against moto's SQS."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from agentkernel.aws import ECSSQSConsumer, LambdaSQSConsumer, sqs_records
from agentkernel.core.errors import AKConfigError
from tests.aws.lambda_harness import pump
from tests.transports.test_sqs import create_fifo

pytestmark = pytest.mark.aws

HERE = Path(__file__).parent
ROOT = Path(__file__).parents[2]


@pytest.fixture(autouse=True)
def _fresh_clients(aws: str) -> Iterator[None]:
    sqs_records.reset()  # the client of an earlier test may point at another endpoint
    LambdaSQSConsumer.reset()
    yield
    LambdaSQSConsumer.reset()


def send(url: str, body: dict[str, Any], group: str = "g") -> None:
    boto3.client("sqs").send_message(
        QueueUrl=url,
        MessageBody=json.dumps(body),
        MessageGroupId=group,
        MessageDeduplicationId=uuid.uuid4().hex,
    )


def queue_is_empty(url: str) -> bool:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attrs = boto3.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=names)
    return all(attrs["Attributes"][n] == "0" for n in names)


def wait_until(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize(
    ("entry", "limit"),
    [
        ("guide_ecs_consumer.py", 2),  # overrides poll (through _get_client) and the settings
        ("guide_ecs_minimal.py", 3),  # the base's poll, delete_message and max_receive_count
    ],
)
def test_an_ecs_entry_file_written_to_the_guide_runs_under_run(
    tmp_path: Path, entry: str, limit: int
) -> None:
    url = create_fifo(f"orders-{uuid.uuid4().hex[:8]}", visibility=1)
    for n in range(3):
        send(url, {"order": n}, group=f"customer-{n % 2}")
    send(url, {"order": 99, "poison": True}, group="customer-9")
    log = tmp_path / "log.jsonl"
    env = os.environ | {
        "ORDERS_QUEUE_URL": url,
        "GUIDE_LOG": str(log),
        "PYTHONPATH": str(ROOT),
        "AK_EXECUTION__QUEUES__SQS__WAIT_TIME_SECONDS": "1",  # the default poll's wait
    }
    errors = tmp_path / "stderr.txt"
    with errors.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, str(HERE / entry)], env=env, stderr=stderr)
    try:

        def notes() -> list[dict[str, Any]]:
            return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

        assert wait_until(lambda: len(notes()) == 4 and queue_is_empty(url), 40), notes()
        processed = sorted(n["body"]["order"] for n in notes() if n["kind"] == "processed")
        failed = [n for n in notes() if n["kind"] == "permanent_failure"]
        assert processed == [0, 1, 2]
        assert [(n["body"]["order"], n["count"]) for n in failed] == [(99, limit + 1)]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, errors.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


class Defaults(ECSSQSConsumer):
    """Only what the guide requires; ``poll`` and ``delete_message`` are the base's."""

    url = ""

    @classmethod
    def get_queue_url(cls) -> str:
        return cls.url

    @classmethod
    def process_message(cls, record: dict[str, Any]) -> None:
        raise AssertionError("not run in this test")

    @classmethod
    def on_permanent_failure(cls, record: dict[str, Any]) -> None:
        raise AssertionError("not run in this test")


def test_the_default_poll_and_delete_message_work_on_raw_boto3_records() -> None:
    Defaults.url = create_fifo(f"defaults-{uuid.uuid4().hex[:8]}", visibility=5)
    send(Defaults.url, {"order": 1})
    records: list[dict[str, Any]] = []
    assert wait_until(lambda: records.extend(Defaults.poll()) or records, 25)
    [record] = records
    assert json.loads(record["Body"]) == {"order": 1}
    assert record["Attributes"]["ApproximateReceiveCount"] == "1"
    assert record["Attributes"]["MessageGroupId"] == "g"
    Defaults.delete_message(record)
    assert queue_is_empty(Defaults.url)


def test_delete_message_refuses_a_record_that_was_not_received() -> None:
    Defaults.url = create_fifo(f"defaults-{uuid.uuid4().hex[:8]}")
    for bad in ({}, {"ReceiptHandle": ""}, {"ReceiptHandle": 7}):
        with pytest.raises(ValueError, match="ReceiptHandle"):
            Defaults.delete_message(bad)


def test_run_refuses_a_missing_url_or_a_bad_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    Defaults.url = ""
    with pytest.raises(AKConfigError, match=r"Defaults\.get_queue_url"):
        Defaults.run()
    Defaults.url = "https://sqs.example/q.fifo"
    for name, bad in [("num_consumers", 0), ("max_receive_count", -1), ("num_consumers", "2")]:
        monkeypatch.setattr(Defaults, name, bad)
        with pytest.raises(ValueError, match=rf"Defaults\.{name}"):
            Defaults.run()
        monkeypatch.undo()


def test_a_subclass_without_get_queue_url_is_told_to_write_one() -> None:
    class NoUrl(ECSSQSConsumer):
        @classmethod
        def process_message(cls, record: dict[str, Any]) -> None: ...

        @classmethod
        def on_permanent_failure(cls, record: dict[str, Any]) -> None: ...

    with pytest.raises(AKConfigError, match=r"NoUrl.get_queue_url\(\): no queue URL; override"):
        NoUrl.run()


# -- Lambda ----------------------------------------------------------------------------------


class Payments(LambdaSQSConsumer):
    """A Lambda consumer as upstream's guide writes one."""

    seen: list[tuple[str, dict[str, Any]]] = []

    @classmethod
    def _get_max_receive_count(cls) -> int:
        return 2

    @classmethod
    def process_message(cls, record: dict[str, Any]) -> None:
        if json.loads(record["body"]).get("poison"):
            raise RuntimeError("cannot take this payment")
        cls.seen.append(("processed", record))

    @classmethod
    def on_permanent_failure(cls, record: dict[str, Any]) -> None:
        cls.seen.append(("permanent_failure", record))


handler = Payments.handle  # how a guide-shaped Lambda entry file names its handler


def test_a_lambda_consumer_written_to_the_guide_gets_raw_records() -> None:
    Payments.seen = []
    url = create_fifo(f"payments-{uuid.uuid4().hex[:8]}", visibility=1)
    send(url, {"payment": 1}, group="a")
    send(url, {"payment": 2, "poison": True}, group="b")
    answers: list[dict[str, Any]] = []
    assert wait_until(lambda: answers.extend(pump(url, handler)) or queue_is_empty(url), 30)
    kinds = [(kind, json.loads(r["body"])) for kind, r in Payments.seen]
    assert ("processed", {"payment": 1}) in kinds
    # The poison is answered on its last allowed delivery (2), before a redrive policy could
    # move it to a dead-letter queue, and is not reported again.
    [(_, failed)] = [(k, r) for k, r in Payments.seen if k == "permanent_failure"]
    assert json.loads(failed["body"]) == {"payment": 2, "poison": True}
    assert failed["attributes"]["ApproximateReceiveCount"] == "2"
    assert {"messageId", "receiptHandle", "eventSource"} <= failed.keys()  # the raw record
    reported = [f for answer in answers for f in answer["batchItemFailures"]]
    assert len(reported) == 1  # the poison's first delivery


class AsyncPayments(LambdaSQSConsumer):
    max_receive_count = 1
    seen: list[str] = []

    @classmethod
    async def process_message(cls, record: dict[str, Any]) -> None:
        cls.seen.append(record["messageId"])

    @classmethod
    async def on_permanent_failure(cls, record: dict[str, Any]) -> None:
        cls.seen.append("failed:" + record["messageId"])


def record(message_id: str, count: str, body: str = "{}") -> dict[str, Any]:
    return {
        "messageId": message_id,
        "receiptHandle": "h-" + message_id,
        "body": body,
        "attributes": {"ApproximateReceiveCount": count, "MessageGroupId": message_id},
        "messageAttributes": {},
        "eventSource": "aws:sqs",
    }


def test_async_class_methods_and_the_max_receive_count_attribute_are_honoured() -> None:
    AsyncPayments.seen = []
    event = {"Records": [record("m1", "1"), record("m2", "2")]}
    assert AsyncPayments.handle(event, None) == {"batchItemFailures": []}
    assert sorted(AsyncPayments.seen) == ["failed:m2", "m1"]


def test_malformed_records_reach_the_guide_methods_as_they_came_or_not_at_all() -> None:
    AsyncPayments.seen = []
    event = {
        "Records": [
            record("m1", "not-a-number"),
            record("m2", "-5"),
            {"messageId": "no-body", "attributes": "not a dict"},
            {"body": "no id to report it by"},
            "not a record",
        ]
    }
    assert AsyncPayments.handle(event, None) == {"batchItemFailures": []}
    # An unreadable count is a first delivery; a dict with an id goes through as it came.
    assert sorted(AsyncPayments.seen) == ["m1", "m2", "no-body"]
    assert AsyncPayments.handle({}, None) == {"batchItemFailures": []}
    assert AsyncPayments.handle({"Records": None}, None) == {"batchItemFailures": []}
