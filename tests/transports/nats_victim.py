"""A NATS consumer process for the kill -9 test: fetches messages, reports them, holds them.

Arguments: the settings as JSON and how many messages to fetch. Prints one JSON line
``[body, receive_count]`` per message, then ``"holding"``, and acknowledges nothing.
"""

import json
import sys

from agentkernel.core.config.queues import NatsQueueConfig
from agentkernel.pipeline.transport.nats import NatsTransport
from agentkernel.pipeline.transport.sync_face import SyncTransport
from agentkernel.pipeline.wire.envelope import QueueName

settings = NatsQueueConfig.model_validate_json(sys.argv[1])
wanted = int(sys.argv[2])
consumer = SyncTransport(NatsTransport(settings)).create_consumer(QueueName.INPUT)
held = []
while len(held) < wanted:
    for message in consumer.fetch(wanted - len(held), 1.0):
        held.append(message)
        print(json.dumps([message.body, message.receive_count]), flush=True)
print(json.dumps("holding"), flush=True)
sys.stdin.read()  # hold them in flight until killed
