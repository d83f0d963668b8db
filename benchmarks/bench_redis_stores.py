"""The Redis store calls of one turn, to weigh the data-loss guard (docs/architecture.md).

One turn's calls: keep the ticket, read the session (it exists), commit, put the reply, read it.
Also the read of a session that does not exist yet (a miss: the guard reads the epoch and the
eviction counter then). Run it against a Redis you may write to, once per checkout to compare:

    python benchmarks/bench_redis_stores.py [TURNS] [REDIS_URL]
"""

from __future__ import annotations

import logging
import sys
import time
import uuid

from agentkernel.pipeline.response_store.redis import RedisResponseStore
from agentkernel.pipeline.session_store.base import TurnOutcome
from agentkernel.pipeline.session_store.redis import RedisSessionStore
from agentkernel.pipeline.wire.records import ResponseRecord, TurnTicket


def main() -> None:
    logging.disable(logging.WARNING)  # the persistence warning of a test server
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    url = sys.argv[2] if len(sys.argv) > 2 else "redis://127.0.0.1:6379/0"
    prefix = f"bench:{uuid.uuid4().hex[:6]}:"
    sessions, replies = RedisSessionStore(url, prefix), RedisResponseStore(url, prefix)

    def turn(i: int, session: str) -> None:
        rid = uuid.uuid4().hex
        replies.accept(TurnTicket(rid, session, "f"))
        base = sessions.read(session)
        sessions.commit(session, base, TurnOutcome(rid, 200, "{}"), {"n": i})
        replies.put(ResponseRecord(rid, session, 200, {}))
        replies.get(rid)

    for i in range(200):
        turn(i, f"s{i % 50}")
    best = []
    for _ in range(3):
        started = time.perf_counter()
        for i in range(turns):
            turn(i, f"s{i % 50}")
        best.append((time.perf_counter() - started) / turns * 1e6)
    started = time.perf_counter()
    for _ in range(500):
        sessions.read(f"new-{uuid.uuid4().hex}")
    miss = (time.perf_counter() - started) / 500 * 1e6
    print(f"per turn (5 store calls): {min(best):.0f} us; read of a new session: {miss:.0f} us")


if __name__ == "__main__":
    main()
