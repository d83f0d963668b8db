"""The NATS streams and partition consumers: creating them, and checking they still match.

Who owns what, so that no process rewrites what another one relies on:

- A stream and its partition count are shared by every process. A stream agentkernel creates
  lists one subject per partition (``<prefix>.0`` ... ``<prefix>.<n-1>``): the stream itself
  records the count, and the broker refuses a publish to a partition it does not have. A stream
  declared with a wildcard (``<prefix>.>``) records nothing; its count is then read from the
  names of its partition consumers.
- The partition consumers of a queue belong to the processes that consume it: INPUT's to the
  Agent Runners, OUTPUT's to the IO processes. Only a consumer of the queue creates or updates
  them (:meth:`Provisioner.own`); a process that only publishes to a queue never touches them.

Start-up checks raise :class:`AKConfigError` (one line naming both values and what to change);
the ``*_problem`` checks, run while the process works, return that line instead.
"""

from __future__ import annotations

import logging
import re
from enum import Enum
from typing import Any, Protocol

from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from agentkernel.core.config.queues import NatsQueueConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.core.redact import redact_url
from agentkernel.pipeline.transport.nats.connection import Connection
from agentkernel.pipeline.transport.nats.owners import lease_seconds, owners_stream
from agentkernel.pipeline.wire.envelope import QueueName

logger = logging.getLogger(__name__)

UNLIMITED = -1
#: Consumer settings an owner may update in place; the others cannot change under a pipeline.
UPDATABLE = ("ack_wait", "max_deliver", "max_ack_pending")
FIXED = ("filter_subject", "ack_policy")
CHANGE_COUNT = "see 'Changing the partition count' in docs/transports.md"


class ProvisionSource(Protocol):
    """What a provisioner uses of its transport (:class:`~.transport.NatsTransport`)."""

    settings: NatsQueueConfig
    #: Queue -> (stream name, subject prefix).
    streams: dict[QueueName, tuple[str, str]]
    max_deliver: dict[QueueName, int]
    conn: Connection

    def run(self, coro: Any, timeout: float | None = None, *, lookup: bool = False) -> Any: ...


class Provisioner:
    """Creates and checks one transport's streams and the consumers it owns."""

    def __init__(self, transport: ProvisionSource) -> None:
        self._t = transport
        self._s = transport.settings

    # -- streams -------------------------------------------------------------------------------

    def ensure_stream(self, queue: QueueName) -> None:
        """Create the queue's stream if missing (``auto_provision``), then check its count.

        Raises:
            AKConfigError: the stream is missing without ``auto_provision``, or it was
                provisioned for another partition count.
        """
        if self._stream_info(queue) is None:
            if not self._s.auto_provision:
                raise AKConfigError(self._missing_stream(queue))
            self._create_stream(queue)
        if problem := self.count_problem(queue):
            raise AKConfigError(problem)

    def stream_problem(self, queue: QueueName) -> str:
        """'' while the stream exists with our count; a missing one is recreated if allowed."""
        if self._stream_info(queue) is None:
            if not self._s.auto_provision:
                return self._missing_stream(queue)
            self._create_stream(queue)
            logger.warning(
                "recreated NATS stream %s: it had been deleted", self._t.streams[queue][0]
            )
            return ""
        return self.count_problem(queue)

    def count_problem(self, queue: QueueName) -> str:
        """'' when the stream's recorded partition count is the configured one."""
        stream, _ = self._t.streams[queue]
        recorded, where = self.recorded_partitions(queue)
        if recorded is None or recorded == self._s.partitions:
            return ""
        return (
            f"execution.queues.nats.partitions is {self._s.partitions} but stream '{stream}' "
            f"has {where} for {recorded} partitions; a process with another count sends "
            f"sessions to partitions nobody serves. Set partitions: {recorded}, or {CHANGE_COUNT}"
        )

    def recorded_partitions(self, queue: QueueName) -> tuple[int | None, str]:
        """The count the stream was provisioned for, and what says so (``None``: nothing yet)."""
        stream, prefix = self._t.streams[queue]
        info = self._stream_info(queue)
        subjects = list(info.config.subjects or []) if info is not None else []
        if subjects and subjects == partition_subjects(prefix, len(subjects)):
            return len(subjects), "subjects and consumers"
        pattern = re.compile(rf"{re.escape(stream)}-p(\d+)")
        found = [
            int(m.group(1))
            for name in self._consumer_names(queue)
            if (m := pattern.fullmatch(name))
        ]
        return (max(found) + 1 if found else None), "consumers"

    def _stream_info(self, queue: QueueName) -> Any:
        try:
            return self._t.run(self._t.conn.js.stream_info(self._t.streams[queue][0]), lookup=True)
        except NotFoundError:
            return None

    def _create_stream(self, queue: QueueName) -> None:
        stream, prefix = self._t.streams[queue]
        config = StreamConfig(
            name=stream,
            subjects=partition_subjects(prefix, self._s.partitions),
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            duplicate_window=self._s.duplicate_window,
            max_age=self._s.max_age,
        )
        self._t.run(self._t.conn.js.add_stream(config))

    def _missing_stream(self, queue: QueueName) -> str:
        return (
            f"execution.queues.nats: stream '{self._t.streams[queue][0]}' does not exist on "
            f"{redact_url(self._s.url)}; declare it (e.g. a NACK Stream resource) or set "
            "auto_provision: true for development"
        )

    # -- consumers (only the processes consuming the queue) -----------------------------------

    def own(self, queue: QueueName) -> None:
        """Create or update the queue's partition consumers: this process consumes the queue.

        Raises:
            AKConfigError: a consumer is missing or differs without ``auto_provision``, or it
                differs in a setting that cannot change in place.
        """
        self.ensure_owners(queue)
        existing = self._consumers(queue)
        updated = []
        for partition in range(self._s.partitions):
            wanted = self.wanted(queue, partition)
            have = existing.get(wanted.durable_name or "")
            if have is None:
                self._add_missing(queue, wanted)
            elif fixed := _differences(have, wanted, FIXED):
                raise AKConfigError(
                    f"{self._name(queue, wanted)} has {fixed}; it cannot be changed in place: "
                    "delete it (after the stream drained) to recreate"
                )
            elif changed := _differences(have, wanted, UPDATABLE):
                self._update(queue, wanted, changed)
                updated.append(changed)
        if updated:  # processes of the old settings see it at their next check
            logger.warning(
                "updated %s NATS consumers of %s: %s; processes still running with the old "
                "settings stop taking messages from them",
                len(updated),
                self._t.streams[queue][0],
                updated[0],
            )

    def consumer_problem(self, queue: QueueName) -> str:
        """'' while every partition consumer exists with this process's settings.

        A deleted one is recreated with ``auto_provision``. One whose settings another process
        changed is a problem either way: this process would misjudge its leases.
        """
        if problem := self.owners_problem(queue):
            return problem
        existing = self._consumers(queue)
        for partition in range(self._s.partitions):
            wanted = self.wanted(queue, partition)
            have = existing.get(wanted.durable_name or "")
            if have is None and not self._s.auto_provision:
                return self._missing_consumer(queue, wanted)
            if have is None:
                self._t.run(self._t.conn.js.add_consumer(self._t.streams[queue][0], wanted))
                logger.warning(
                    "recreated NATS consumer %s: it had been deleted", wanted.durable_name
                )
            elif changed := _differences(have, wanted, FIXED + UPDATABLE):
                return (
                    f"{self._name(queue, wanted)} has {changed} since this process started; "
                    "restart it with the consumer's settings"
                )
        return ""

    def wanted(self, queue: QueueName, partition: int) -> ConsumerConfig:
        stream, prefix = self._t.streams[queue]
        return ConsumerConfig(
            durable_name=f"{stream}-p{partition}",
            filter_subject=f"{prefix}.{partition}",
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self._s.ack_wait,
            max_deliver=self._t.max_deliver[queue],
            max_ack_pending=self._s.max_ack_pending,
        )

    # -- the owners stream (see .owners) --------------------------------------------------------

    def ensure_owners(self, queue: QueueName) -> float:
        """Create the queue's owners stream if missing (``auto_provision``); returns its lease.

        Raises:
            AKConfigError: it is missing without ``auto_provision``, or it cannot fence (no
                ``max_age``, or more than one record per subject).
        """
        info = self._owners_info(queue)
        if info is None:
            if not self._s.auto_provision:
                raise AKConfigError(self._missing_owners(queue))
            self._t.run(self._t.conn.js.add_stream(self._owners_config(queue)))
            info = self._owners_info(queue)
        if problem := self._owners_settings_problem(queue, info):
            raise AKConfigError(problem)
        lease = float(info.config.max_age)
        if lease > self._s.ack_wait:
            logger.warning(
                "%s has max_age %ss, over ack_wait %ss: a dead runner's partitions wait that "
                "long for a new owner",
                owners_stream(self._t.streams[queue][0]),
                lease,
                self._s.ack_wait,
            )
        return lease

    def owners_problem(self, queue: QueueName) -> str:
        """'' while the owners stream can fence; a missing one is recreated if allowed."""
        info = self._owners_info(queue)
        if info is None:
            if not self._s.auto_provision:
                return self._missing_owners(queue)
            self._t.run(self._t.conn.js.add_stream(self._owners_config(queue)))
            logger.warning("recreated NATS stream %s", owners_stream(self._t.streams[queue][0]))
            return ""
        return self._owners_settings_problem(queue, info)

    def _owners_config(self, queue: QueueName) -> StreamConfig:
        name = owners_stream(self._t.streams[queue][0])
        lease = lease_seconds(self._s.ack_wait)
        return StreamConfig(
            name=name,
            subjects=[f"{name}.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_msgs_per_subject=1,
            max_age=lease,
            duplicate_window=lease,
        )

    def _owners_info(self, queue: QueueName) -> Any:
        try:
            name = owners_stream(self._t.streams[queue][0])
            return self._t.run(self._t.conn.js.stream_info(name), lookup=True)
        except NotFoundError:
            return None

    def _owners_settings_problem(self, queue: QueueName, info: Any) -> str:
        config = info.config
        name = owners_stream(self._t.streams[queue][0])
        if not config.max_age or config.max_msgs_per_subject != 1:
            return (
                f"execution.queues.nats: stream '{name}' has max_age {config.max_age} and "
                f"max_msgs_per_subject {config.max_msgs_per_subject}; partition ownership "
                f"needs max_age > 0 (the ownership lease) and max_msgs_per_subject 1"
            )
        return ""

    def _missing_owners(self, queue: QueueName) -> str:
        name = owners_stream(self._t.streams[queue][0])
        lease = lease_seconds(self._s.ack_wait)
        return (
            f"execution.queues.nats: stream '{name}' (partition ownership) does not exist on "
            f"{redact_url(self._s.url)}; declare it with subjects ['{name}.>'], retention "
            f"limits, max_msgs_per_subject 1, max_age {lease:g}s (at most ack_wait), "
            "duplicate_window at most max_age, file storage; or set auto_provision: true "
            "for development"
        )

    def _add_missing(self, queue: QueueName, wanted: ConsumerConfig) -> None:
        if not self._s.auto_provision:
            raise AKConfigError(self._missing_consumer(queue, wanted))
        self._t.run(self._t.conn.js.add_consumer(self._t.streams[queue][0], wanted))

    def _update(self, queue: QueueName, wanted: ConsumerConfig, changed: str) -> None:
        if not self._s.auto_provision:
            raise AKConfigError(
                f"{self._name(queue, wanted)} has {changed}; update the declared consumer, or "
                "set auto_provision: true to let agentkernel update it"
            )
        self._t.run(self._t.conn.js.add_consumer(self._t.streams[queue][0], wanted))

    def _name(self, queue: QueueName, wanted: ConsumerConfig) -> str:
        stream = self._t.streams[queue][0]
        return f"execution.queues.nats: consumer '{wanted.durable_name}' of stream '{stream}'"

    def _missing_consumer(self, queue: QueueName, wanted: ConsumerConfig) -> str:
        return (
            f"execution.queues.nats: consumer '{wanted.durable_name}' of stream "
            f"'{self._t.streams[queue][0]}' does not exist; declare it or set "
            "auto_provision: true for development"
        )

    def _consumers(self, queue: QueueName) -> dict[str, ConsumerConfig]:
        infos = self._t.run(self._t.conn.js.consumers_info(self._t.streams[queue][0]))
        return {info.name: info.config for info in infos if info.name}

    def _consumer_names(self, queue: QueueName) -> list[str]:
        try:
            infos = self._t.run(
                self._t.conn.js.consumers_info(self._t.streams[queue][0]), lookup=True
            )
        except NotFoundError:
            return []
        return [info.name for info in infos if info.name]


def partition_subjects(prefix: str, partitions: int) -> list[str]:
    """One subject per partition: a stream with these records its partition count."""
    return [f"{prefix}.{p}" for p in range(partitions)]


def _differences(have: ConsumerConfig, wanted: ConsumerConfig, fields: tuple[str, ...]) -> str:
    """``ack_wait 300.0 (configured: 30.0)``, ... for the fields that differ; '' when none."""
    out = []
    for field in fields:
        current, target = _normal(getattr(have, field)), _normal(getattr(wanted, field))
        if current != target:
            out.append(f"{field} {current} (configured: {target})")
    return ", ".join(out)


def _normal(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if value is None:
        return UNLIMITED  # the server reports an unset cap as absent
    if isinstance(value, float):
        return round(value, 3)
    return value
