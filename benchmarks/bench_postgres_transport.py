"""The PostgreSQL transport against raw psycopg doing the same queue work, side by side.

Publish N messages (50 sessions, 200-byte bodies), then fetch (10 at a time) and acknowledge
them all with one consumer: first with plain psycopg on a plain ``SKIP LOCKED`` queue table
(one INSERT per message; one UPDATE ... SKIP LOCKED ... RETURNING per fetch, taking a lease and
counting the delivery; one DELETE per ack), then with the agentkernel transport, which also
keeps one message in flight per session, dedups and notifies. Both tables are analysed between
publishing and consuming, as autovacuum does for a running queue (the transport's migration sets
its table to be analysed every 1000 changed rows): a queue table fresh from creation has no
statistics, and the planner then scans the whole queue on every fetch.

  python benchmarks/bench_postgres_transport.py [--dsn postgresql://...] [-n 2000]
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from benchmarks.bench_transports import BODY, SESSIONS, timed

from agentkernel.core.config import PostgresQueueConfig
from agentkernel.pipeline.envelope import QueueMessage, QueueName
from agentkernel.pipeline.postgres.schema import migrate
from agentkernel.pipeline.transport.postgres import PostgresTransport

RAW_TABLE = """
CREATE TABLE {t} (id bigserial PRIMARY KEY, group_id text, body text NOT NULL,
  receive_count integer NOT NULL DEFAULT 0, visible_at timestamptz NOT NULL DEFAULT now())"""
RAW_FETCH = """
UPDATE {t} SET receive_count = receive_count + 1, visible_at = now() + interval '30 seconds'
WHERE id IN (SELECT id FROM {t} WHERE visible_at <= now() ORDER BY id LIMIT 10
             FOR UPDATE SKIP LOCKED)
RETURNING id, body"""


def raw_postgres(dsn: str, n: int) -> tuple[float, float]:
    table = f"raw_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RAW_TABLE.format(t=table))  # type: ignore[arg-type]

        def publish() -> None:
            for i in range(n):
                conn.execute(
                    f"INSERT INTO {table} (group_id, body) VALUES (%s, %s)",  # type: ignore[arg-type]
                    [f"s{i % SESSIONS}", BODY],
                )

        def consume() -> None:
            done = 0
            while done < n:
                for row in conn.execute(RAW_FETCH.format(t=table)).fetchall():  # type: ignore[arg-type]
                    conn.execute(f"DELETE FROM {table} WHERE id = %s", [row[0]])  # type: ignore[arg-type]
                    done += 1

        published = n / timed(publish)
        conn.execute(f"ANALYZE {table}")  # type: ignore[arg-type]
        rates = published, n / timed(consume)
        conn.execute(f"DROP TABLE {table}")  # type: ignore[arg-type]
    return rates


def pipeline_postgres(dsn: str, n: int) -> tuple[float, float]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, schema)
    transport = PostgresTransport(PostgresQueueConfig(dsn=dsn, db_schema=schema))
    consumer = transport.create_consumer(QueueName.INPUT)

    def publish() -> None:
        for i in range(n):
            message = QueueMessage(
                body=BODY,
                group_id=f"s{i % SESSIONS}",
                dedup_id=uuid.uuid4().hex,
                attributes={"request_id": str(i)},
            )
            transport.send(QueueName.INPUT, message)

    def consume() -> None:
        done = 0
        while done < n:
            for message in consumer.fetch(10, 1.0):
                consumer.ack(message)
                done += 1

    try:
        published = n / timed(publish)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'ANALYZE "{schema}".queue_messages')  # type: ignore[arg-type]
        return published, n / timed(consume)
    finally:
        consumer.close()
        transport.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("-n", type=int, default=2000)
    args = parser.parse_args()
    raw, ours = raw_postgres(args.dsn, args.n), pipeline_postgres(args.dsn, args.n)
    print(f"## postgres: {args.n} messages, {SESSIONS} sessions, one consumer")
    print("| | publish msg/s | fetch+ack msg/s |\n|---|---|---|")
    print(f"| raw psycopg | {raw[0]:.0f} | {raw[1]:.0f} |")
    print(f"| agentkernel `PostgresTransport` | {ours[0]:.0f} | {ours[1]:.0f} |")
    print(f"| ratio | {ours[0] / raw[0]:.2f} | {ours[1] / raw[1]:.2f} |")


if __name__ == "__main__":
    main()
