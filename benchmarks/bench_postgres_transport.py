"""The PostgreSQL transport against raw psycopg doing the same queue work, side by side.

Raw: plain psycopg on a plain ``SKIP LOCKED`` queue table (one INSERT per message; one
UPDATE ... SKIP LOCKED ... RETURNING per fetch of 10, taking a lease and counting the delivery;
one DELETE per ack). Ours: the agentkernel transport, which also keeps one message in flight per
session, dedups and wakes other processes' fetchers with ``NOTIFY``. 50 sessions, 200-byte
bodies, one consumer.

On a shared machine the raw loop's own rate moves with the load by more than the difference
being measured, so the two run in many short rounds, alternating which goes first: each round
publishes ``-n`` messages to each queue and then fetches and acknowledges them all, and its ratio
compares two runs a fraction of a second apart. The report gives the medians over the rounds and
the spread of the per-round ratios. A warm-up round (not counted) fills and drains both queues,
then both tables are analysed, as autovacuum does for a running queue: a table fresh from
creation has no statistics, and the planner then scans the whole queue on every fetch. Both
tables carry the transport's autovacuum settings, so neither is vacuumed more often.

  python benchmarks/bench_postgres_transport.py [--dsn postgresql://...] [-n 400] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from benchmarks.bench_transports import BODY, SESSIONS, timed

from agentkernel.core.config.queues import PostgresQueueConfig
from agentkernel.pipeline.postgres.schema import migrate
from agentkernel.pipeline.transport.postgres import PostgresTransport
from agentkernel.pipeline.wire.envelope import QueueMessage, QueueName

RAW_TABLE = """
CREATE TABLE {t} (id bigserial PRIMARY KEY, group_id text, body text NOT NULL,
  receive_count integer NOT NULL DEFAULT 0, visible_at timestamptz NOT NULL DEFAULT now());
ALTER TABLE {t} SET (
  autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
  autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 1000)"""
RAW_FETCH = """
UPDATE {t} SET receive_count = receive_count + 1, visible_at = now() + interval '30 seconds'
WHERE id IN (SELECT id FROM {t} WHERE visible_at <= now() ORDER BY id LIMIT 10
             FOR UPDATE SKIP LOCKED)
RETURNING id, body"""


@dataclass
class Side:
    """One side of the comparison: publish n, fetch and ack n, and its queue table."""

    publish: Callable[[int], None]
    consume: Callable[[int], None]
    table: str


@contextmanager
def raw_side(dsn: str) -> Iterator[Side]:
    table = f"raw_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RAW_TABLE.format(t=table))  # type: ignore[arg-type]

        def publish(n: int) -> None:
            for i in range(n):
                conn.execute(
                    f"INSERT INTO {table} (group_id, body) VALUES (%s, %s)",  # type: ignore[arg-type]
                    [f"s{i % SESSIONS}", BODY],
                )

        def consume(n: int) -> None:
            done = 0
            while done < n:
                for row in conn.execute(RAW_FETCH.format(t=table)).fetchall():  # type: ignore[arg-type]
                    conn.execute(f"DELETE FROM {table} WHERE id = %s", [row[0]])  # type: ignore[arg-type]
                    done += 1

        try:
            yield Side(publish, consume, table)
        finally:
            conn.execute(f"DROP TABLE {table}")  # type: ignore[arg-type]


@contextmanager
def our_side(dsn: str) -> Iterator[Side]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn, schema)
    transport = PostgresTransport(PostgresQueueConfig(dsn=dsn, db_schema=schema))
    consumer = transport.create_consumer(QueueName.INPUT)

    def publish(n: int) -> None:
        for i in range(n):
            message = QueueMessage(
                body=BODY,
                group_id=f"s{i % SESSIONS}",
                dedup_id=uuid.uuid4().hex,
                attributes={"request_id": str(i)},
            )
            transport.send(QueueName.INPUT, message)

    def consume(n: int) -> None:
        done = 0
        while done < n:
            for message in consumer.fetch(10, 1.0):
                consumer.ack(message)
                done += 1

    try:
        yield Side(publish, consume, f'"{schema}".queue_messages')
    finally:
        consumer.close()
        transport.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')  # type: ignore[arg-type]


def one_round(sides: list[Side], n: int) -> list[tuple[float, float]]:
    """Publish n to each side, then drain each; (publish, fetch+ack) msg/s per side."""
    published = [n / timed(lambda side=side: side.publish(n)) for side in sides]
    drained = [n / timed(lambda side=side: side.consume(n)) for side in sides]
    return list(zip(published, drained, strict=True))


def run(dsn: str, n: int, rounds: int) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Per round: ((raw publish, raw fetch+ack), (ours publish, ours fetch+ack)) msg/s."""
    results = []
    with raw_side(dsn) as raw, our_side(dsn) as ours:
        one_round([raw, ours], n)  # warm-up: connections, prepared statements, statistics
        with psycopg.connect(dsn, autocommit=True) as conn:
            for side in (raw, ours):
                conn.execute(f"ANALYZE {side.table}")  # type: ignore[arg-type]
        for i in range(rounds):
            got = one_round([raw, ours], n) if i % 2 == 0 else one_round([ours, raw], n)[::-1]
            results.append((got[0], got[1]))
            print(f"round {i + 1}: raw {got[0][1]:.0f}, ours {got[1][1]:.0f}", file=sys.stderr)
    return results


def spread(values: list[float]) -> str:
    """Quartiles and range of ``values``: 'q1-q3 (min-max)'."""
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{q1:.2f}-{q3:.2f} ({min(values):.2f}-{max(values):.2f})"


def report(
    n: int, rounds: list[tuple[tuple[float, float], tuple[float, float]]], load: float
) -> None:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    raw = [med([r[0][i] for r in rounds]) for i in (0, 1)]
    ours = [med([r[1][i] for r in rounds]) for i in (0, 1)]
    ratios = [[r[1][i] / r[0][i] for r in rounds] for i in (0, 1)]
    print(f"## postgres: {n} messages a round, {len(rounds)} rounds, {SESSIONS} sessions")
    print(f"load average (1 min): {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print("| | publish msg/s | fetch+ack msg/s |\n|---|---|---|")
    print(f"| raw psycopg (median) | {raw[0]:,.0f} | {raw[1]:,.0f} |")
    print(f"| agentkernel `PostgresTransport` (median) | {ours[0]:,.0f} | {ours[1]:,.0f} |")
    print(f"| ratio (median of the rounds) | {med(ratios[0]):.2f} | {med(ratios[1]):.2f} |")
    print(f"| ratio quartiles (range) | {spread(ratios[0])} | {spread(ratios[1])} |")
    raws = [r[0][1] for r in rounds]
    print(f"raw fetch+ack moved between {min(raws):,.0f} and {max(raws):,.0f} msg/s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("-n", type=int, default=400, help="messages per round and side")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    report(args.n, run(args.dsn, args.n, args.rounds), load)


if __name__ == "__main__":
    main()
