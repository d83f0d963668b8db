"""A consumer process for the kill -9 test: fetches records, reports them, never acks."""

import json
import sys

from agentkernel.core.config import KafkaQueueConfig
from agentkernel.pipeline.envelope import QueueName
from agentkernel.pipeline.transport.kafka import KafkaTransport

settings = KafkaQueueConfig.model_validate_json(sys.argv[1])
transport = KafkaTransport(settings)
consumer = transport.create_consumer(QueueName.INPUT)
held = []
while len(held) < int(sys.argv[2]):
    for message in consumer.fetch(10, 1.0):
        held.append(message)
        print(json.dumps([message.body, message.receive_count]), flush=True)
sys.stdin.read()  # hold everything in flight until killed
