"""The statements of the PostgreSQL transport (:mod:`agentkernel.pipeline.transport.postgres`).

``{s}`` is the schema; parameters are named. A queue's messages are rows of ``queue_messages``;
a row is *in flight* while its ``visible_at`` lies ahead with a ``lease_token`` set, and
*delayed* while ``visible_at`` lies ahead without one. A group's *head* is its lowest id: only
heads are handed out, so one message per group is in flight and the group's order holds.
Sends of one group take an advisory lock on it first, so ids rise in commit order within a group.
"""

from __future__ import annotations

#: Serialises the sends of one group (ids then rise in commit order within it).
GROUP_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%(lock)s, 0))"

#: Keeps the dedup id unless a live one is kept; no row back means a duplicate.
DEDUP = """
INSERT INTO {s}.queue_dedup (queue, dedup_id, expires_at)
VALUES (%(queue)s, %(dedup)s, now() + make_interval(secs => %(window)s))
ON CONFLICT (queue, dedup_id) DO UPDATE SET expires_at = EXCLUDED.expires_at
WHERE queue_dedup.expires_at <= now()
RETURNING 1"""

SEND = """
INSERT INTO {s}.queue_messages (queue, group_id, body, attributes)
VALUES (%(queue)s, %(group)s, %(body)s, %(attributes)s)
RETURNING id, pg_notify(%(channel)s, '')"""

#: Leases up to ``n`` visible heads (messages with no older one in their group) and ungrouped
#: messages, oldest first, walking the queue in id order; rows another fetch is leasing right
#: now are skipped, and re-checked once it commits. Rows come back as (id, group, body,
#: attributes, receive count, NULL); when none was leased, one row of NULLs instead whose last
#: column is the seconds until the next message may become fetchable (a lease or delay ends;
#: NULL when none will), so an empty fetch costs one round trip, not two.
CLAIM = """
WITH candidates AS (
  SELECT m.id FROM {s}.queue_messages m
  WHERE m.queue = %(queue)s AND m.visible_at <= now()
    AND (m.group_id IS NULL OR NOT EXISTS (
      SELECT 1 FROM {s}.queue_messages p
      WHERE p.queue = m.queue AND p.group_id = m.group_id AND p.id < m.id))
  ORDER BY m.id LIMIT %(n)s
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE {s}.queue_messages m
  SET receive_count = m.receive_count + 1, lease_token = %(token)s,
      visible_at = now() + make_interval(secs => %(lease)s)
  WHERE m.id = ANY (ARRAY(SELECT id FROM candidates)) AND m.visible_at <= now()
  RETURNING m.id, m.group_id, m.body, m.attributes, m.receive_count
)
SELECT id, group_id, body, attributes, receive_count, NULL::float8 FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, extract(epoch FROM min(visible_at) - now())::float8
FROM {s}.queue_messages
WHERE queue = %(queue)s AND visible_at > now() AND NOT EXISTS (SELECT 1 FROM claimed)
HAVING NOT EXISTS (SELECT 1 FROM claimed)"""

ACK = """
WITH gone AS (
  DELETE FROM {s}.queue_messages WHERE id = %(id)s AND lease_token = %(token)s RETURNING id)
SELECT pg_notify(%(channel)s, '') FROM gone"""

#: Hands the message back, visible after ``delay`` seconds (0: at once).
RELEASE = """
WITH back AS (
  UPDATE {s}.queue_messages SET lease_token = NULL,
    visible_at = now() + make_interval(secs => %(delay)s)
  WHERE id = %(id)s AND lease_token = %(token)s RETURNING id)
SELECT pg_notify(%(channel)s, '') FROM back"""

EXTEND = """
UPDATE {s}.queue_messages SET visible_at = now() + make_interval(secs => %(lease)s)
WHERE id = %(id)s AND lease_token = %(token)s"""

DEAD_LETTER = """
WITH gone AS (
  DELETE FROM {s}.queue_messages WHERE id = %(id)s AND lease_token = %(token)s
  RETURNING id, queue, group_id, body, attributes, receive_count, enqueued_at),
kept AS (
  INSERT INTO {s}.queue_dead (id, queue, group_id, body, attributes, receive_count,
                              enqueued_at)
  SELECT * FROM gone ON CONFLICT (id) DO NOTHING)
SELECT pg_notify(%(channel)s, '') FROM gone"""

#: Retention, run by the transport's sweeper: (table, condition) pairs.
SWEEPS = (
    ("queue_dedup", "expires_at <= now()"),
    ("queue_messages", "enqueued_at <= now() - make_interval(secs => %(max_age)s)"),
    ("queue_dead", "dead_at <= now() - make_interval(secs => %(dead_age)s)"),
)
