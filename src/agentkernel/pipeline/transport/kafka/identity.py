"""Which cluster and which incarnation of a topic a consumer reads.

A topic that is deleted and created again (or a broker that kept its topics in memory and
restarted) numbers its offsets from 0 again. Positions handed to the runner name the topic id
with the partition, so an offset of the new topic is never compared with one of the old.

The bookkeeping keys (receive counts, finished offsets, dedup claims) name the cluster id with
the consumer group, so two clusters whose groups and topics have the same names can share one
Redis without one's records being skipped or dropped as duplicates of the other's.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from confluent_kafka import KafkaException, TopicCollection

logger = logging.getLogger(__name__)


def topic_ids(admin: Any, topics: list[str], timeout: float) -> dict[str, str | None]:
    """The id of each topic; ``None`` for one whose id the broker does not report.

    A topic without an id gets no positions: its replays are recognised by request id only.
    """
    ids: dict[str, str | None] = dict.fromkeys(topics)
    try:
        futures = admin.describe_topics(TopicCollection(topics), request_timeout=timeout)
        for name, future in futures.items():
            ids[name] = str(future.result(timeout).topic_id)
    except (KafkaException, TimeoutError, TypeError, ValueError) as exc:
        logger.warning(
            "Kafka did not report the ids of topics %s (%s): a turn delivered again is then "
            "recognised by request id only, within a session's latest 64 turns",
            ", ".join(topics),
            exc,
        )
    return ids


def cluster_id(metadata: Any) -> str | None:
    """The id the cluster reports in its metadata (``None`` when it reports none).

    Only an answer without an id gives ``None``: a cluster that does not answer fails the
    transport's start instead, so its keys are never named by the fallback for a moment.
    """
    found = metadata.cluster_id
    return str(found) if found else None


def bookkeeping_prefix(cluster: str | None, group: str, bootstrap: str = "") -> str:
    """The key prefix of a consumer group's bookkeeping: ``ak:<cluster id>:<group>:``.

    A cluster that reports no id is named by its sorted bootstrap servers instead. Characters
    that would split a key (``:``) or form a Redis Cluster hash tag (``{}``) become ``_``.
    """
    if cluster is None:
        servers = sorted(s.strip() for s in bootstrap.split(",") if s.strip())
        cluster = "bootstrap=" + ",".join(servers)
    return f"ak:{_UNSAFE.sub('_', cluster)}:{group}:"


_UNSAFE = re.compile(r"[:{}\s]")


def unit_of(topic: str, partition: int, topic_id: str | None) -> str | None:
    """The ordering unit of a partition (``None`` without a topic id)."""
    return None if topic_id is None else f"kafka:{topic}[{partition}]@{topic_id}"
