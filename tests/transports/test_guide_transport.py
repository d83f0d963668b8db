"""The contract suite on a transport written only to the guide, with no capability flag set.

What it does not implement (a delayed nack, lease extension, positions, a consumer that holds
resources) is detected by the suite, which then checks the transport is consistent about it.
"""

from __future__ import annotations

from agentkernel.pipeline.testing import QueueTransportContract
from agentkernel.pipeline.transport.base import QueueTransport
from agentkernel.pipeline.wire.envelope import QueueName
from tests.transports.guide_transport import GuideTransport


class TestGuideTransportContract(QueueTransportContract):
    def make_transport(self) -> QueueTransport:
        GuideTransport.reset()
        return GuideTransport(ack_wait=self.ack_wait, dedup_window=self.dedup_window)

    # A subclass written against upstream's suite adds cases with upstream's helper names.
    def test_my_own_case_with_upstreams_helpers(self) -> None:
        transport, consumer = self._pair()
        transport.send(QueueName.INPUT, self._msg(body="m1", group_id="s1", attributes={"k": "v"}))
        [message] = consumer.fetch(10, self.fetch_wait)
        assert (message.body, message.attributes) == ("m1", {"k": "v"})
        assert self._consumer(transport, QueueName.OUTPUT).fetch(10, 0.05) == []
