"""An ECS consumer entry file written as upstream's guide writes one: class methods over raw
boto3 records, a ``poll`` override through ``_get_client()``, ``run()`` as the entry point."""

import json
import os

from agentkernel.aws import ECSSQSConsumer


def note(kind: str, record: dict) -> None:
    line = {
        "kind": kind,
        "body": json.loads(record["Body"]),
        "count": int(record["Attributes"]["ApproximateReceiveCount"]),
    }
    with open(os.environ["GUIDE_LOG"], "a") as log:
        log.write(json.dumps(line) + "\n")


class OrderConsumer(ECSSQSConsumer):
    max_receive_count = 2
    num_consumers = 2

    @classmethod
    def get_queue_url(cls) -> str:
        return os.environ["ORDERS_QUEUE_URL"]

    @classmethod
    def poll(cls) -> list:
        # A shorter long poll than the default, as the guide suggests overriding poll() for.
        resp = cls._get_client().receive_message(
            QueueUrl=cls.get_queue_url(),
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        return resp.get("Messages", [])

    @classmethod
    def process_message(cls, record: dict) -> None:
        if json.loads(record["Body"]).get("poison"):
            raise RuntimeError("cannot process this order")
        note("processed", record)

    @classmethod
    def on_permanent_failure(cls, record: dict) -> None:
        note("permanent_failure", record)


if __name__ == "__main__":
    OrderConsumer.run()
