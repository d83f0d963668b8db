"""The contract suite on a transport written only to the guide, with no capability flag set.

What it does not implement (a delayed nack, lease extension, positions, a consumer that holds
resources) is detected by the suite, which then checks the transport is consistent about it.
"""

from __future__ import annotations

from agentkernel.pipeline.testing import QueueTransportContract
from agentkernel.pipeline.transport.base import QueueTransport
from tests.transports.guide_transport import GuideTransport


class TestGuideTransportContract(QueueTransportContract):
    def make_transport(self) -> QueueTransport:
        GuideTransport.reset()
        return GuideTransport(ack_wait=self.ack_wait, dedup_window=self.dedup_window)
