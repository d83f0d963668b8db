"""Chaos: the Redis behind the stores loses data while a split deployment runs.

An IO process and two runners on a private NATS server keep their sessions and replies in a
private redis-server without persistence (how the split walkthrough used to start it). Sessions
send a few turns, then the fault hits, then each session sends its next turn and retries its
first one with the same ``Idempotency-Key``:

- ``redis-wiped``: Redis is restarted, and comes back empty.
- ``redis-evicting``: ``maxmemory`` and ``allkeys-lru`` are set behind the running processes and
  a burst of other keys evicts idle sessions; a runner started then must refuse to start.

Bounds: no turn is answered from an emptied session (``silently restarted``), no retry is
accepted and left unanswered, ``/ready`` fails, the IO process logs the loss, and no process
writes more than ``LOG_RECORDS_PER_PROCESS`` log records. Each scenario prints its tally line.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.chaos import budget
from tests.chaos.cluster import AGENTS, LOG_RECORD, nats_env, stores_env
from tests.chaos.infra import EphemeralRedis, PrivateNats
from tests.chaos.scenarios import LOG_RECORDS_PER_PROCESS
from tests.e2e.deployment import Deployment

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.redis,
    pytest.mark.nats,
    budget.waits(),
]

SESSIONS = 10
TURNS_BEFORE = 2
#: Seconds a scenario may take from the first turn; it usually takes under twenty.
WANTED = 45.0
WARM_UP_SECONDS = 40.0
#: Seconds an accepted retry is polled before it counts as accepted and never answered.
RETRY_POLL_SECONDS = 5.0
TRANSIENT = ("STORE_UNAVAILABLE", "QUEUE_UNAVAILABLE")


@dataclass
class Split:
    """The private servers and the processes of one scenario."""

    redis: EphemeralRedis
    nats: PrivateNats
    deployment: Deployment
    started: float = field(default_factory=time.monotonic)

    def admin(self) -> object:
        import redis

        return redis.Redis.from_url(self.redis.url, socket_timeout=5)


@pytest.fixture
def split(tmp_path: Path) -> Iterator[Split]:
    workdir = Path(os.environ.get("CHAOS_WORKDIR", tmp_path)) / "storeloss"
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "logs").mkdir(parents=True)
    redis, nats = EphemeralRedis(workdir / "redis"), PrivateNats(workdir / "nats")
    deployment = Deployment({}, log_dir=workdir / "logs")
    tag = deployment.tag
    deployment.env |= stores_env(redis.url, tag) | nats_env(nats.url, tag)
    try:
        deployment.start_io()
        for _ in range(2):
            deployment.runner(AGENTS)
        yield Split(redis, nats, deployment)
    finally:
        deployment.close()
        redis.stop()
        nats.stop()


@dataclass
class Tally:
    """What the callers, the probe and the logs showed after the fault."""

    label: str
    before: int = 0
    sent_before: int = 0
    after: Counter[str] = field(default_factory=Counter)
    ready: str = "?"
    logged_by_io: bool = False
    refused_start: str = "-"
    log_records: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def line(self) -> str:
        a = self.after
        logs = self.log_records.values()
        return (
            f"chaos storeloss/{self.label}: answered before {self.before}/{self.sent_before}; "
            f"after: refused STORE_DATA_LOST {a['lost']}, answered right {a['right']}, "
            f"silently restarted {a['restarted']}, retries accepted and never answered "
            f"{a['hanging']}, other {a['other']}; /ready {self.ready}; loss logged by io "
            f"{'yes' if self.logged_by_io else 'no'}; runner started after: "
            f"{self.refused_start}; log records {sum(logs)} (max {max(logs, default=0)}/process, "
            f"bound {LOG_RECORDS_PER_PROCESS}); {self.seconds:.0f}s"
        )

    def violations(self) -> list[str]:
        found = []
        if self.before != self.sent_before:
            found.append(f"only {self.before}/{self.sent_before} turns answered before the fault")
        for kind in ("restarted", "hanging", "other"):
            if self.after[kind]:
                found.append(f"{self.after[kind]} turns {kind} after the fault")
        if not self.ready.startswith("503"):
            found.append(f"/ready answered {self.ready} after the fault")
        if not self.logged_by_io:
            found.append("the IO process did not log the loss")
        found += [
            f"{name} wrote {n} log records" for name, n in self.log_records.items()
            if n > LOG_RECORDS_PER_PROCESS
        ]  # fmt: skip
        return found


def post(client: httpx.Client, session: str, prompt: str, key: str) -> httpx.Response:
    """POST a turn; an answer that only says "retry" (Redis just restarted) is retried."""
    body = {"session_id": session, "prompt": prompt, "agent": "recorder"}
    deadline = time.monotonic() + 10
    while True:
        response = client.post(
            "/api/v1/chat", json=body, headers={"Idempotency-Key": key}, timeout=70
        )
        if response.json().get("error") not in TRANSIENT or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


def warm_up(client: httpx.Client) -> None:
    deadline = time.monotonic() + WARM_UP_SECONDS
    while (response := post(client, "warm-up", "hi", "w")).status_code != 200:
        assert time.monotonic() < deadline, f"no warm-up reply: {response.text}"
        time.sleep(0.5)


def judge(client: httpx.Client, response: httpx.Response, prompts: list[str]) -> str:
    """How one answer after the fault is classed (``prompts``: what the session held)."""
    doc = response.json()
    if response.status_code == 503 and doc.get("error") == "STORE_DATA_LOST":
        return "lost"
    if response.status_code == 200:
        got = json.loads(doc["result"])
        return "right" if got[:-1] == prompts or got == prompts else "restarted"
    if response.status_code in (202, 504):
        location = {"request_id": doc["request_id"]}
        deadline = time.monotonic() + RETRY_POLL_SECONDS
        while time.monotonic() < deadline:
            read = client.get(f"/api/v1/chat/{doc['session_id']}", params=location)
            if read.status_code != 404:
                return judge(client, read, prompts)
            time.sleep(0.2)
        return "hanging"
    return "other"


def run(split: Split, label: str, fault: Callable[[Split, Tally], None], cap: float) -> Tally:
    client, tally = split.deployment.client, Tally(label)
    warm_up(client)
    started = time.monotonic()
    held: dict[str, list[str]] = {}
    for s in range(SESSIONS):
        session = f"{split.deployment.tag}-{s}"
        held[session] = [f"t{t}" for t in range(TURNS_BEFORE)]
        for prompt in held[session]:
            tally.sent_before += 1
            tally.before += post(client, session, prompt, f"{session}:{prompt}").status_code == 200
    fault(split, tally)
    for session, prompts in held.items():
        if time.monotonic() - started > cap:
            tally.after["other"] += 1  # out of time: counted, never silently skipped
            continue
        tally.after[judge(client, post(client, session, "next", f"{session}:next"), prompts)] += 1
        retry = post(client, session, prompts[0], f"{session}:{prompts[0]}")
        tally.after[judge(client, retry, prompts[:1])] += 1
    ready = client.get("/ready")
    tally.ready = f"{ready.status_code} {ready.json().get('message', 'ready')}"
    tally.seconds = time.monotonic() - started
    tally.log_records, tally.logged_by_io = count_logs(split.deployment)
    return tally


def count_logs(deployment: Deployment) -> tuple[dict[str, int], bool]:
    counts, logged = {}, False
    for log in deployment.logs:
        text = log.read_bytes()
        counts[log.name] = sum(1 for line in text.splitlines() if LOG_RECORD.match(line))
        if log.name.startswith("io-") and b"ERROR" in text and b"epoch" in text:
            logged = True
        if log.name.startswith("io-") and b"evicted" in text and b"ERROR" in text:
            logged = True
    return counts, logged


def wipe(split: Split, tally: Tally) -> None:
    """Redis restarted without persistence: it comes back empty."""
    split.redis.stop()
    split.redis.start()


def evict(split: Split, tally: Tally) -> None:
    """An eviction policy set behind the processes, then a burst that evicts idle sessions."""
    admin = split.admin()
    used = int(admin.info("memory")["used_memory"])  # type: ignore[attr-defined]
    admin.config_set("maxmemory-policy", "allkeys-lru")  # type: ignore[attr-defined]
    admin.config_set("maxmemory", str(used + 1_000_000))  # type: ignore[attr-defined]
    for i in range(500):
        admin.set(f"burst:{i}", "x" * 10_000)  # type: ignore[attr-defined]
    evicted = int(admin.info("stats")["evicted_keys"])  # type: ignore[attr-defined]
    admin.config_set("maxmemory", "0")  # type: ignore[attr-defined]
    assert evicted > 0, "the burst evicted nothing"
    runner = split.deployment.runner(AGENTS)
    try:
        code = runner.wait(30)
    except Exception:
        runner.kill()
        code = None
    log = split.deployment.logs[-1].read_text()
    refused = code not in (0, None) and "allow_eviction" in log
    tally.refused_start = f"refused (exit {code})" if refused else f"NOT refused (exit {code})"


@pytest.mark.timeout(WANTED + WARM_UP_SECONDS + 120)
@pytest.mark.parametrize(("label", "fault"), [("redis-wiped", wipe), ("redis-evicting", evict)])
def test_storeloss(
    label: str,
    fault: Callable[[Split, Tally], None],
    split: Split,
    request: pytest.FixtureRequest,
    record_tally: Callable[[str], None],
) -> None:
    cap = budget.cap(request.config, WANTED)
    tally = run(split, label, fault, cap)
    record_tally(tally.line())
    problems = tally.violations()
    if label == "redis-evicting" and not tally.refused_start.startswith("refused"):
        problems.append(f"a runner started on an evicting Redis: {tally.refused_start}")
    assert not problems, "\n".join([tally.line(), *problems])
