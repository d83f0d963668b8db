"""Which consumer owns which partition of a queue, recorded in JetStream itself.

Only the owner of a partition pulls from its durable consumer, so only the owner sees the
partition's messages in order and can keep each session to one turn in flight (see
:mod:`.book`). Ownership lives in the small stream ``<stream>_OWNERS``:

- ``<stream>_OWNERS.p.<n>`` holds the id of partition ``n``'s owner (one message per subject).
  A consumer claims a partition by publishing its id there with
  ``Nats-Expected-Last-Subject-Sequence: 0`` (refused while anyone's record exists) and renews it
  with the sequence of its last record (refused once anyone else wrote). The stream's
  ``max_age`` is the ownership lease: a record not renewed disappears with it, so a dead owner's
  partitions are free after at most one lease, shorter than ``ack_wait``.
- ``<stream>_OWNERS.m.<id>`` is each live consumer's heartbeat; their count decides each
  consumer's fair share, ``ceil(partitions / consumers)``, and an owner above its share hands the
  extra partitions back.

Fencing: a consumer believes it owns a partition only until ``sent + lease``, where ``sent`` is
when it sent the last renewal the server confirmed (the record's server time is later, so the
record outlives the belief), and every pull request it sends expires before the belief ends.
So no delivery reaches a former owner after the record disappeared, and a new owner, which
claims only then, sees in the partition consumer's state everything delivered before it
(:meth:`.book.Book.blocker`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nats.js.errors import APIError, NotFoundError

from agentkernel.pipeline.transport.nats.errors import CLIENT_ERRORS

logger = logging.getLogger(__name__)

#: Renewals per lease: three may be lost before a belief ends.
RENEWALS_PER_LEASE = 4
#: The server's error code for a publish whose expected last subject sequence differs.
WRONG_LAST_SEQUENCE = 10071


def lease_seconds(ack_wait: float) -> float:
    """The ownership lease agentkernel provisions: a third of ``ack_wait``, at least a second,
    never over ``ack_wait`` (a dead owner's partitions are taken over within one message lease).
    """
    return min(ack_wait, max(ack_wait / 3, 1.0))


def owners_stream(stream: str) -> str:
    return f"{stream}_OWNERS"


@dataclass
class Claim:
    """One partition this consumer owns: the record's sequence and when the belief ends."""

    revision: int
    until: float  # loop time


class Owners:
    """The partitions one consumer owns, kept on the connection's loop.

    Args:
        js: the JetStream context.
        stream: the queue's stream (its owners stream is ``<stream>_OWNERS``).
        partitions: the partition count.
        lease: the owners stream's ``max_age``, in seconds.
        gained: awaited when a partition becomes ours (before it is pulled from).
        lost: awaited when a partition stops being ours; ``handing_back`` says we gave it up
            (its record is purged after ``lost`` returns), else the belief ran out.
        busy: whether a partition still has messages here (running, waiting, or a pull
            request open). A partition above the fair share is first marked ``leaving`` (no
            more pulls) and handed back once it is not busy, or after one lease at the most:
            handing back a busy partition gives its waiting messages back, a delivery each.
    """

    def __init__(
        self,
        js: Any,
        stream: str,
        partitions: int,
        lease: float,
        gained: Callable[[int], Awaitable[None]],
        lost: Callable[[int, bool], Awaitable[None]],
        busy: Callable[[int], bool] = lambda partition: False,
    ) -> None:
        self._js = js
        self._stream = owners_stream(stream)
        self._partitions = partitions
        self.lease = lease
        self._gained = gained
        self._lost = lost
        self._busy = busy
        #: Partitions above the fair share, not pulled from any more: handed back once idle or
        #: at this loop time.
        self.leaving: dict[int, float] = {}
        self.member = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.claims: dict[int, Claim] = {}
        self._task: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Task[None]] = set()
        self._stopped = False
        # Partitions first tried by this member: spreads the claims of consumers starting at once.
        self._offset = uuid.UUID(self.member.rsplit("-", 1)[-1] * 4).int % partitions

    @property
    def period(self) -> float:
        return self.lease / RENEWALS_PER_LEASE

    def owns(self, partition: int, now: float, margin: float = 0.0) -> bool:
        claim = self.claims.get(partition)
        return claim is not None and now + margin < claim.until

    async def start(self) -> None:
        """Claim a first share now (so a new consumer fetches at once), then keep renewing."""
        await self.tick()
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopped:
            started = loop.time()
            try:
                await self.tick()
            except Exception:  # the next tick tries again; beliefs run out meanwhile
                logger.warning("%s: ownership tick failed", self._stream, exc_info=True)
            await asyncio.sleep(max(self.period - (loop.time() - started), 0.01))

    async def tick(self) -> None:
        """Renew, then move toward the fair share: hand back extras or claim free partitions."""
        loop = asyncio.get_running_loop()
        await self.expire(loop.time())
        with contextlib.suppress(*CLIENT_ERRORS):
            await self._js.publish(f"{self._stream}.m.{self.member}", b"", stream=self._stream)
        await asyncio.gather(*(self._renew(p) for p in list(self.claims)))
        await self.expire(loop.time())
        if self._stopped:
            return
        try:
            info = await self._js.stream_info(self._stream, subjects_filter=">")
        except CLIENT_ERRORS:
            return
        subjects = info.state.subjects or {}
        members = max(sum(1 for s in subjects if s.startswith(f"{self._stream}.m.")), 1)
        share = math.ceil(self._partitions / members)
        if self._shed(share, loop.time()):
            return
        taken = {int(s.rsplit(".", 1)[1]) for s in subjects if s.startswith(f"{self._stream}.p.")}
        order = [(self._offset + i) % self._partitions for i in range(self._partitions)]
        for partition in order:
            if len(self.claims) >= share or self._stopped:
                break
            if partition not in taken and partition not in self.claims:
                await self._claim(partition)

    def _shed(self, share: int, now: float) -> bool:
        """Move toward ``share`` from above: mark the extra partitions (the idle ones first)
        as leaving, and hand back those no longer busy or leaving for a lease. Returns whether
        this consumer is above its share."""
        extra = len(self.claims) - share
        if extra <= 0:
            self.leaving.clear()  # the share grew back (a member left): keep pulling
            return False
        ordered = sorted(self.claims, key=lambda p: (p not in self.leaving, self._busy(p), p))
        chosen = ordered[:extra]
        self.leaving = {p: self.leaving.get(p, now + self.lease) for p in chosen}
        for partition, deadline in list(self.leaving.items()):
            if not self._busy(partition) or now >= deadline:
                del self.leaving[partition]
                self.release(partition)
        return True

    async def _claim(self, partition: int) -> None:
        sent = asyncio.get_running_loop().time()
        revision = await self._write(partition, 0)
        if revision is None:
            return
        self.claims[partition] = Claim(revision, sent + self.lease)
        logger.debug("%s: %s owns partition %s", self._stream, self.member, partition)
        try:
            await self._gained(partition)
        except BaseException:
            self.release(partition)
            raise

    async def _renew(self, partition: int) -> None:
        claim = self.claims.get(partition)
        if claim is None:
            return
        sent = asyncio.get_running_loop().time()
        try:
            revision = await self._write(partition, claim.revision, quiet=False)
        except APIError as exc:
            if getattr(exc, "err_code", None) != WRONG_LAST_SEQUENCE:
                return
            revision = await self._ours(partition)  # our last renewal may have landed unseen
            if revision is None:
                logger.warning("%s: partition %s was taken over", self._stream, partition)
                await self._drop(partition, handing_back=False)
                return
            claim.revision = revision  # the belief is not extended: it was not confirmed
            return
        if revision is not None and partition in self.claims:
            self.claims[partition] = Claim(revision, sent + self.lease)

    async def _write(self, partition: int, expected: int, quiet: bool = True) -> int | None:
        """Publish our id as the partition's record if its last sequence is ``expected``.

        Returns:
            the new record's sequence; ``None`` when refused (``quiet``) or not answered.
        """
        headers = {"Nats-Expected-Last-Subject-Sequence": str(expected)}
        try:
            ack = await self._js.publish(
                f"{self._stream}.p.{partition}",
                self.member.encode(),
                stream=self._stream,
                headers=headers,
            )
        except APIError:
            if quiet:
                return None
            raise
        except CLIENT_ERRORS:
            return None
        return int(ack.seq)

    async def _ours(self, partition: int) -> int | None:
        """The record's sequence if it names this consumer (``None``: someone else's or none)."""
        try:
            raw = await self._js.get_msg(self._stream, subject=f"{self._stream}.p.{partition}")
        except NotFoundError:
            return None
        except CLIENT_ERRORS:
            return self.claims[partition].revision if partition in self.claims else None
        return int(raw.seq) if raw.data == self.member.encode() else None

    async def expire(self, now: float) -> None:
        for partition, claim in list(self.claims.items()):
            if now >= claim.until:
                logger.warning(
                    "%s: the lease on partition %s ran out before it was renewed",
                    self._stream,
                    partition,
                )
                await self._drop(partition, handing_back=False)

    async def _drop(self, partition: int, handing_back: bool) -> None:
        self.leaving.pop(partition, None)
        if self.claims.pop(partition, None) is not None:
            await self._lost(partition, handing_back)

    def release(self, partition: int) -> None:
        """Hand the partition back: stop using it at once; once its last pull requests ended,
        delete its record, so the next owner need not wait for the lease."""
        self.leaving.pop(partition, None)
        claim = self.claims.pop(partition, None)
        if claim is None:
            return
        task = asyncio.ensure_future(self._hand_back(partition, claim))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _hand_back(self, partition: int, claim: Claim) -> None:
        await self._lost(partition, True)
        if asyncio.get_running_loop().time() < claim.until:  # still ours: nobody else wrote
            with contextlib.suppress(*CLIENT_ERRORS):
                await self._js.purge_stream(self._stream, subject=f"{self._stream}.p.{partition}")

    async def stop(self) -> None:
        """Hand every partition back and leave (the member heartbeat is deleted)."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, *CLIENT_ERRORS):
                await self._task
        for partition in list(self.claims):
            self.release(partition)
        if self._releasing:
            await asyncio.wait(set(self._releasing))
        with contextlib.suppress(*CLIENT_ERRORS):
            await self._js.purge_stream(self._stream, subject=f"{self._stream}.m.{self.member}")
