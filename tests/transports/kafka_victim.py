"""A consumer process for the kill -9 tests: fetches records, reports them, then waits to die.

Arguments: the settings as JSON, how many records to fetch, and what to do with them:

- ``hold``: acknowledge nothing;
- ``ack-behind``: keep the record with the lowest offset in flight, acknowledge the others;
- ``ack-behind-unmarked``: the same, with a bookkeeping store that loses the finished marks.

Prints one JSON line ``[body, receive_count]`` per record, then ``"settled"``.
"""

import json
import sys

from confluent_kafka.admin import AdminClient

from agentkernel.core.config.queues import KafkaQueueConfig
from agentkernel.pipeline.transport.bookkeeping import RedisBookkeepingStore
from agentkernel.pipeline.transport.kafka import KafkaTransport
from agentkernel.pipeline.transport.kafka.identity import bookkeeping_prefix, cluster_id
from agentkernel.pipeline.wire.envelope import QueueName


class UnmarkedBookkeeping(RedisBookkeepingStore):
    """Redis bookkeeping whose finished marks never arrive (as when Redis fails at ack time)."""

    def finish(self, partition: str, offset: int) -> None:
        pass


settings = KafkaQueueConfig.model_validate_json(sys.argv[1])
wanted, mode = int(sys.argv[2]), sys.argv[3]
books = None
if mode == "ack-behind-unmarked":
    # The keys the transport itself would use (named by the cluster and the group).
    cluster = cluster_id(
        AdminClient({"bootstrap.servers": settings.bootstrap_servers}).list_topics(timeout=5.0)
    )
    prefix = bookkeeping_prefix(cluster, settings.group_id, settings.bootstrap_servers)
    books = UnmarkedBookkeeping(settings.bookkeeping_redis_url, prefix)
consumer = KafkaTransport(settings, books).create_consumer(QueueName.INPUT)
held = []
while len(held) < wanted:
    for message in consumer.fetch(10, 1.0):
        held.append(message)
        print(json.dumps([message.body, message.receive_count]), flush=True)
if mode != "hold":
    held.sort(key=lambda m: int((m.message_id or "").rsplit(":", 1)[1]))
    for message in held[1:]:
        consumer.ack(message)
print(json.dumps("settled"), flush=True)
sys.stdin.read()  # hold the rest in flight until killed
