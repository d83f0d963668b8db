"""Where a process's CPU per turn goes, from py-spy raw profiles (``bench_scaleout --py-spy``).

Each sample is charged to one component: the frame nearest the leaf that matches one of
``COMPONENTS``, in that order (JSON encoding inside a store call counts as JSON, the store
call's own Python as the Redis client, and so on). A column's shares are scaled to the CPU per
turn measured for that process in the same window, given after ``=`` in milliseconds:

  python benchmarks/profile_table.py before-io.txt=3.44 this-io.txt=2.57

GIL samples (``--gil``) count Python work; system-call time with the GIL released is spread
over the components in proportion, so the table says where the Python work goes, not the
kernel's.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

COMPONENTS: list[tuple[str, tuple[str, ...]]] = [
    ("JSON encode/decode", ("json/", "orjson")),
    ("pydantic validation and dumps", ("pydantic",)),
    ("logging", ("logging/",)),
    ("metrics", ("pipeline/process/metrics.py",)),
    ("deep copies", ("copy.py",)),
    ("tracing context", ("opentelemetry", "pipeline/tracing.py")),
    ("Redis client (redis-py)", ("redis/",)),
    ("NATS client (nats-py)", ("nats/aio", "nats/js", "nats/protocol", "nats/nuid")),
    (
        "thread hops: executor, futures, locks",
        ("concurrent/futures", "asyncio/threads.py", "threading.py:", "call_soon_threadsafe"),
    ),
    ("h11 parsing and writing", ("h11/",)),
    ("uvicorn", ("uvicorn/",)),
    ("FastAPI/Starlette: routing, middleware, responses", ("fastapi/", "starlette/")),
    ("agentkernel NATS transport", ("pipeline/transport/nats",)),
    ("agentkernel: front, handling, stores, runner", ("agentkernel/",)),
    ("asyncio: loop, tasks, futures", ("asyncio/",)),
    ("sockets, select", ("selectors", "socket.py")),
]


def component(frames: list[str]) -> str:
    """The component a sample's stack (root first) is charged to."""
    for frame in reversed(frames):
        for name, keys in COMPONENTS:
            if any(key in frame for key in keys):
                return name
    return "other"


def shares(path: Path) -> dict[str, float]:
    """Each component's share of the samples in a py-spy raw (collapsed) file."""
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        counts[component(stack.split(";")[1:])] += int(count)  # [0] names the thread
    total = sum(counts.values()) or 1
    return {name: n / total for name, n in counts.items()}


def main() -> None:
    columns = []
    for arg in sys.argv[1:]:
        path, _, ms = arg.rpartition("=")
        columns.append((Path(path).name, shares(Path(path)), float(ms)))
    names = [name for name, _ in COMPONENTS] + ["other"]
    print("| component | " + " | ".join(f"{c[0]}, ms/turn" for c in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name in names:
        cells = [f"{ms * share.get(name, 0.0):.2f}" for _, share, ms in columns]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("| **total** | " + " | ".join(f"**{ms:.2f}**" for _, _, ms in columns) + " |")


if __name__ == "__main__":
    main()
