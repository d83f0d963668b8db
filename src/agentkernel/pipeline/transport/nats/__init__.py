"""NATS JetStream transport: the transport (streams, partitions, publishing) and its consumer."""

from agentkernel.pipeline.transport.nats.transport import NatsTransport, partition_of

__all__ = ["NatsTransport", "partition_of"]
