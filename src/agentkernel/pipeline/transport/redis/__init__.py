"""Redis Streams: one stream per session, dispatched by session tokens through a consumer group.

Each queue has a *ready* stream read by one consumer group, and one stream per session holding
that session's messages in order. ``send`` appends the message to its session's stream and,
when the session had no message waiting, adds a token naming the session to the ready stream;
both happen in one Lua script, together with the dedup marker (``SET NX PX`` of the
``dedup_id``, dropping the message when the marker exists). So a session with messages has
exactly one token, and only the consumer holding it sees the session's head: one message in
flight per session, in order, while turns in flight grow with consumers (any number of
sessions run at once, on any consumer).

Leases are the group's pending entries. A fetch first claims tokens idle for ``ack_wait``
(``XAUTOCLAIM``: a crashed or stuck consumer's session comes back after its lease), then reads
new ones (``XREADGROUP``), then looks up each session's head, all in one script; with nothing
there, it blocks on the ready stream in slices of at most ``block_slice`` seconds so that
expired and nacked tokens, and a stop, are seen within one. The token's delivery counter is the
head's exact ``receive_count``, since every head gets a fresh token. ``ack`` deletes the head
and the token and adds a token for the next message of the session, if any (sent without
waiting for the answer, read before the next fetch: :mod:`.acks`); ``extend_lease``
resets the token's idle time (``XCLAIM ... IDLE 0 JUSTID``, which counts no delivery); ``nack``
makes it claimable at once, ``nack_later`` after a delay up to ``ack_wait``; ``dead_letter``
copies the entry to the ``dlq`` stream with the reason. Each of these checks first that the
delivery the handle names is still the current one (the same group member, the same count), so
a stale handle does nothing. A closing
consumer hands its tokens to a parking member, claimable at once, before it leaves the group.

Positions (replay detection): each message carries ``n`` from a per-queue counter, so numbers
rise across all sessions of a queue even when a session's stream is deleted (once empty) and
created again, and whatever entry ids another client wrote; the unit names the queue's
incarnation, a random id stored beside the counter, new once the queue's keys are gone.

Redis Cluster (a ``redis+cluster://`` URL): every key of a queue carries the hash tag
``{<prefix><queue>}`` (see :mod:`.keys`), so each script touches one slot, even the session
streams FETCH and RESOLVE find through tokens (built from the tag, so not passed in KEYS); one
queue is served by one node (tens of thousands of operations a second, far above turn rates),
INPUT and OUTPUT land apart. The contract suite runs on a cluster, on Redis 6.2 and on Valkey
(tests/transports/test_redis_streams_servers.py); a server older than 6.2 is refused at start-up.

Provisioning: the consumer groups are created by ``auto_provision`` (development) or by the
operator; without them start-up fails naming the command.
"""

from __future__ import annotations

from agentkernel.pipeline.transport.redis.consumer import RedisStreamsConsumer
from agentkernel.pipeline.transport.redis.transport import RedisStreamsTransport

__all__ = ["RedisStreamsConsumer", "RedisStreamsTransport"]
