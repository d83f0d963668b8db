"""Which incarnation of a topic a consumer reads: the broker's topic id.

A topic that is deleted and created again (or a broker that kept its topics in memory and
restarted) numbers its offsets from 0 again. Positions handed to the runner name the topic id
with the partition, so an offset of the new topic is never compared with one of the old.
"""

from __future__ import annotations

import logging
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


def unit_of(topic: str, partition: int, topic_id: str | None) -> str | None:
    """The ordering unit of a partition (``None`` without a topic id)."""
    return None if topic_id is None else f"kafka:{topic}[{partition}]@{topic_id}"
