"""The public contract suite every queue transport must pass.

Subclass :class:`QueueTransportContract` in a test module, implement :meth:`make_transport`, and
pytest collects every case::

    class TestMyTransport(QueueTransportContract):
        ack_wait = 1.0

        def make_transport(self) -> QueueTransport:
            return MyTransport(visibility_timeout=self.ack_wait)

Optional capabilities (``nack_later``, ``extend_lease``, positions, a ``close`` that releases
something) are detected from what the transport implements, and the suite checks that a transport
without one is consistent about it: a transport written only to the guide passes unchanged.
Capability flags declare a guarantee the broker cannot give; set one to ``False`` only with a
comment saying why. The cases that check a declared-off capability are removed from that
subclass's suite (they are not skipped: nothing is silently passed over at run time).
A transport lists in ``undecodable_kinds`` what can be published to its broker that it cannot
decode, and publishes each kind natively in ``send_undecodable``; the cases check that such a
message is handed out marked ``undecodable``, delays nothing beside it, and once dead-lettered
never comes back.
Time-dependent cases call :meth:`advance`, which sleeps by default and which an in-process
transport may override to move a fake clock instead; where a lease must run out they call
:meth:`force_redelivery` (upstream's name), which advances past ``ack_wait`` unless overridden.

For detailed assertion messages, call ``pytest.register_assert_rewrite(
"agentkernel.pipeline.testing")`` in your ``conftest.py`` before importing this module.
"""

from agentkernel.pipeline.testing.contract import QueueTransportContract

__all__ = ["QueueTransportContract"]
