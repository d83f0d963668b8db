"""Kafka: the session is the record key, acknowledgement is rebuilt on the client.

Kafka only tracks a committed offset per partition, so each consumer keeps the records it fetched
in offset order per partition and hands a record out when no earlier record of the same key is
pending: sessions sharing a partition still run in parallel, each session strictly one turn at a
time. ``nack`` puts the record back at the head of its session after ``retry_backoff`` seconds
without holding up other sessions; ``dead_letter`` copies it to ``<topic><dlq_suffix>`` with an
``ak-error`` header, then acknowledges it.

One private thread per consumer owns the client (confluent-kafka serialises the calls on one
consumer, so a commit from another thread waits for the poll in progress, and forever if that poll
is inside a rebalance callback waiting for the committing thread). ``ack``/``nack`` only record the
outcome; the thread sends an asynchronous commit of the finished prefix within ``POLL_SECONDS``.

Crashes and rebalances replay only what was running: the committed offset moves past a finished
prefix only, but every acknowledged record is also marked finished in the bookkeeping store, and
the partition's next owner skips marked records instead of running them again. When a rebalance
takes a partition away, the consumer first waits (up to ``rebalance_drain_timeout`` seconds, the
lock released) for its records in flight there, then commits and waits up to ``commit_timeout``
for the broker to confirm, so the next owner does not start a session's turn while the previous
owner is still running it.

Receive counts live in the bookkeeping store too (Redis for counts that survive restarts); a
count is dropped only once a confirmed commit covers its record. There is no lease: a record
handed to a live but stuck worker is not redelivered until its partition moves to another
consumer (declared on the contract: ``timeout_redelivery``).
"""

from __future__ import annotations

from agentkernel.pipeline.transport.kafka.consumer import KafkaConsumer
from agentkernel.pipeline.transport.kafka.transport import KafkaTransport

__all__ = ["KafkaConsumer", "KafkaTransport"]
