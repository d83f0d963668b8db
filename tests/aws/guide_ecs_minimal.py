"""The smallest ECS consumer entry file of upstream's guide: the default ``poll`` and
``delete_message``, the default ``max_receive_count`` (3)."""

import json
import os

from agentkernel.aws import ECSSQSConsumer


class InvoiceConsumer(ECSSQSConsumer):
    num_consumers = 1

    @classmethod
    def get_queue_url(cls) -> str:
        return os.environ["ORDERS_QUEUE_URL"]

    @classmethod
    def process_message(cls, record: dict) -> None:
        if json.loads(record["Body"]).get("poison"):
            raise RuntimeError("cannot process this invoice")
        cls.note("processed", record)

    @classmethod
    def on_permanent_failure(cls, record: dict) -> None:
        cls.note("permanent_failure", record)

    @staticmethod
    def note(kind: str, record: dict) -> None:
        count = int(record["Attributes"]["ApproximateReceiveCount"])
        line = {"kind": kind, "body": json.loads(record["Body"]), "count": count}
        with open(os.environ["GUIDE_LOG"], "a") as log:
            log.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    InvoiceConsumer.run()
