"""CPU per turn as sessions grow old: the embedded pipeline, a session's 1st turn to its 300th.

Every other benchmark here sends each turn in a new session. A chat sends many turns in one,
and what a session keeps grows with them: its record (the latest 64 request ids, the log of its
latest 50 turns), which every turn reads and writes back, and the response store's index of its
replies. This drives the embedded pipeline at its defaults (``AKConfig.load()``, as ``agentkernel
serve`` runs it) through its ASGI callable in this process, without sockets: ``--sessions``
sessions, each sending ``--turns`` no-op turns one after the other (all sessions at once, so
``--sessions`` turns are in flight), and reports the CPU per turn by the sessions' age.

With ``--baseline SRC`` (the ``src`` folder of another checkout, e.g. ``git archive <rev> src |
tar -x -C /tmp/base``) the same runs with that code too, in alternating child processes:

  python benchmarks/bench_long_sessions.py [--sessions 32] [--turns 300] [--rounds 3]
      [--baseline /tmp/base/src]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid

from child_runs import child_result

#: The sessions' age brackets reported, as (first turn, last turn), 1-based.
BRACKETS = ((1, 10), (11, 50), (51, 100), (101, 200), (201, 300), (301, 1000))


async def drive(sessions: int, turns: int) -> list[float]:
    """CPU microseconds per turn for each turn number (all sessions' n-th turns together)."""
    # Imported here, so that a child process runs the code its PYTHONPATH names.
    from bench_asgi_inprocess import build, post, start

    from agentkernel.pipeline.runtime.collector import tune_for_server

    handler, app = build()
    tune_for_server()  # as a server process does
    start(handler)

    async def turn(session_id: str) -> None:
        body = json.dumps({"agent": "noop", "session_id": session_id, "prompt": "hi"}).encode()
        status = await post(app, "/api/v1/chat", body)
        if status != 200:
            raise RuntimeError(f"a turn was answered {status}")

    ids = [uuid.uuid4().hex for _ in range(sessions)]
    per_turn = []
    for _ in range(turns):
        started = time.process_time()
        await asyncio.gather(*(turn(session_id) for session_id in ids))
        per_turn.append((time.process_time() - started) / sessions * 1e6)
    return per_turn


def child(args: argparse.Namespace) -> None:
    print(json.dumps(asyncio.run(drive(args.sessions, args.turns))))


def run(src: str | None, args: argparse.Namespace) -> list[float]:
    more = ("--sessions", str(args.sessions), "--turns", str(args.turns))
    return list(child_result(__file__, src, *more))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3, help="child processes per code")
    parser.add_argument("--baseline", help="src folder of the code to compare with")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    codes = {"this": None} | ({"before": args.baseline} if args.baseline else {})
    runs: dict[str, list[list[float]]] = {name: [] for name in codes}
    for _ in range(args.rounds):  # alternating, so the machine's noise hits both alike
        for name, src in codes.items():
            runs[name].append(run(src, args))
    brackets = [(a, min(b, args.turns)) for a, b in BRACKETS if a <= args.turns]
    print(f"{args.sessions} sessions x {args.turns} no-op turns, embedded defaults, in-process")
    print(f"CPU us per turn by the session's turn number (median of {args.rounds} runs)\n")
    print("| code | " + " | ".join(f"turns {a}-{b}" for a, b in brackets) + " |")
    print("|---|" + "---|" * len(brackets))
    for name, per_run in runs.items():
        cells = []
        for a, b in brackets:
            cells.append(statistics.median(statistics.mean(r[a - 1 : b]) for r in per_run))
        print(f"| {name} | " + " | ".join(f"{c:.0f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
