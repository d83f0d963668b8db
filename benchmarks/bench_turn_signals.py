"""What the turn signals cost a turn on Redis and PostgreSQL (docs/turn-control.md).

Every turn pays one ``start`` and one ``close`` in the runner (and one ``open`` in the front);
a runner polls ``stops`` once per ``poll_interval`` while it runs turns. Each figure is the
client-side time per call, best of three rounds, beside one bare round trip of the same client
(``PING``, ``SELECT 1``) and a turn's session read and commit, to read it against:

    python benchmarks/bench_turn_signals.py [PAIRS] [REDIS_URL] [POSTGRES_DSN]
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Callable

from agentkernel.core.config.stores import PostgresStoreConfig
from agentkernel.pipeline.session_store.base import SessionStore, TurnOutcome
from agentkernel.pipeline.session_store.postgres import PostgresSessionStore
from agentkernel.pipeline.session_store.redis import RedisSessionStore


def per_call(calls: int, run: Callable[[int], None]) -> float:
    """Microseconds per call of ``run`` (``calls`` of them), best of three rounds."""
    best = []
    for _ in range(3):
        started = time.perf_counter()
        for i in range(calls):
            run(i)
        best.append((time.perf_counter() - started) / calls * 1e6)
    return min(best)


def measure(name: str, store: SessionStore, bare: Callable[[], None], pairs: int) -> None:
    signals, run = store.turn_signals(), uuid.uuid4().hex[:8]
    assert signals is not None
    ids = [f"{run}-{i}" for i in range(pairs)]
    for i in range(100):  # warm the pool and the scripts
        signals.start(f"s-{run}", f"warm-{i}")
        signals.close(f"s-{run}", f"warm-{i}")

    def pair(i: int) -> None:
        signals.start(f"s-{run}-{i % 50}", ids[i])
        signals.close(f"s-{run}-{i % 50}", ids[i])

    def turn(i: int) -> None:
        signals.open(f"s-{run}-{i % 50}", ids[i])
        pair(i)

    def commit(i: int) -> None:
        session = f"c-{run}-{i % 50}"
        store.commit(session, store.read(session), TurnOutcome(ids[i], 200, "{}"), {"n": i})

    polled = ids[:10]
    figures = {
        "bare round trip": per_call(pairs, lambda i: bare()),
        "session read + commit": per_call(pairs, commit),
        "start + close": per_call(pairs, pair),
        "open + start + close": per_call(pairs, turn),
        "stops of 10 turns": per_call(pairs, lambda i: signals.stops(polled)),
    }
    print(f"{name} ({pairs} calls a round, best of 3):")
    for label, us in figures.items():
        print(f"  {label:22} {us:7.0f} us")


def main() -> None:
    logging.disable(logging.WARNING)  # the persistence warning of a test server
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    url = sys.argv[2] if len(sys.argv) > 2 else "redis://127.0.0.1:6379/0"
    dsn = sys.argv[3] if len(sys.argv) > 3 else "postgresql://postgres@127.0.0.1:5432/test"
    redis_store = RedisSessionStore(url, f"bench:{uuid.uuid4().hex[:6]}:")
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    pg_store = PostgresSessionStore(
        PostgresStoreConfig(dsn=dsn, db_schema=schema, auto_provision=True)
    )
    stores: list[SessionStore] = [redis_store, pg_store]
    try:
        client = redis_store._redis
        measure("Redis", redis_store, client.ping, pairs)

        def select_one() -> None:
            with pg_store._db.connection("bench") as conn:
                conn.execute("SELECT 1")

        measure("PostgreSQL", pg_store, select_one, pairs)
    finally:
        with pg_store._db.connection("bench") as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')  # type: ignore[call-overload]
        for store in stores:
            store.close()


if __name__ == "__main__":
    main()
