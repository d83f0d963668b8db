"""A deployment under test: private servers, an IO process, supervised runners.

Every process gets the product's default settings except what a topology cannot do without
(addresses, unique queue names, ``auto_provision`` in place of an operator creating the queues,
and the Tansu consumer settings its broker needs; see docs/chaos.md). Nothing here shortens a
lease, an ack wait or a retry.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import servers
from tests.chaos.infra import PrivateNats, PrivatePostgres, PrivateRedis, PrivateServer
from tests.chaos.trace import NatsTrace
from tests.e2e.deployment import Deployment

AGENTS = Path(__file__).with_name("agents.py")
SUPERVISE_EVERY = 0.2
#: A SIGTERMed process must exit 0 within this many seconds (its drain), or it is killed.
DRAIN_BOUND = 30.0
#: The Tansu broker needs these (its defaults make a group join take ~23 s); see tests/servers.py.
TANSU_CONSUMER = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "fetch.wait.max.ms": 10}
#: The first line of a record in the CLI's log format ("%(asctime)s %(levelname)s ...").
LOG_RECORD = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")
#: The INFO line of a finished turn (``<time> INFO <thread> agentkernel.turns: turn ...``).
TURN_LINE = re.compile(rb"^\S+ \S+ INFO \S+ agentkernel\.turns: turn ")
#: The AWS default visibility timeout of a new queue; the product may override it per receive.
SQS_VISIBILITY = 30


@dataclass
class Exit:
    """How a process sent SIGTERM ended: its status (None: killed after the bound) and when."""

    role: str
    code: int | None
    seconds: float

    @property
    def clean(self) -> bool:
        return self.code == 0 and self.seconds <= DRAIN_BOUND


@dataclass
class Events:
    """What happened to the processes and servers during a scenario."""

    faults: list[str] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    crashes: int = 0
    errors: list[str] = field(default_factory=list)
    #: (monotonic time, what): faults, exits and restarts, for the slow turns' timelines.
    timeline: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fault(self, text: str) -> None:
        with self.lock:
            self.faults.append(text)
        self.note(text)

    def note(self, text: str) -> None:
        with self.lock:
            self.timeline.append((time.monotonic(), text))


class Cluster:
    """One topology's processes and servers, with runner supervision like an orchestrator's.

    Args:
        topology: ``embedded``, ``nats``, ``sqs``, ``kafka``, ``redis`` or ``postgres``.
        workdir: where logs and server data go.
        runners: runner processes (broker topologies).
        moto_url: the moto server (``sqs``).
        kafka_bootstrap: the Tansu broker (``kafka``).
    """

    def __init__(
        self,
        topology: str,
        workdir: Path,
        runners: int = 3,
        moto_url: str | None = None,
        kafka_bootstrap: str | None = None,
    ) -> None:
        self.topology = topology
        self.workdir = workdir
        self.trace: NatsTrace | None = None
        self.events = Events()
        self.runner_count = 0 if topology == "embedded" else runners
        self.runners: list[subprocess.Popen[str]] = []
        self._held: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        self.nats: PrivateNats | None = None
        self.postgres: PrivatePostgres | None = None
        #: Postgres-only runs no Redis: its transport and both stores are in PostgreSQL.
        self.redis = None if topology == "postgres" else PrivateRedis(workdir / "redis")
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.deployment = Deployment({}, log_dir=workdir / "logs")
        try:
            if topology == "nats":
                self.nats = PrivateNats(workdir / "nats")
            if topology == "postgres":
                self.postgres = PrivatePostgres(workdir / "postgres")
            env = self._env(moto_url, kafka_bootstrap)
        except BaseException:
            self.close()
            raise
        # Triage only (docs/chaos.md): try a setting without editing the suite; CI sets nothing.
        self.deployment.env |= env | json.loads(os.environ.get("CHAOS_ENV", "{}"))

    def _env(self, moto_url: str | None, kafka_bootstrap: str | None) -> dict[str, str]:
        tag = self.deployment.tag
        if self.postgres is not None:
            self._migrate(self.postgres.dsn)
            return postgres_env(self.postgres.dsn)
        assert self.redis is not None
        env = stores_env(self.redis.url, tag)
        if self.topology == "redis":
            return env | redis_env(self.redis.url, tag)
        if self.nats is not None:
            return env | nats_env(self.nats.url, tag)
        if self.topology == "sqs" and moto_url is not None:
            return env | sqs_env(moto_url, tag)
        if self.topology == "kafka" and kafka_bootstrap is not None:
            return env | kafka_env(kafka_bootstrap, self.redis.url, tag)
        if self.topology == "embedded":
            return env
        raise ValueError(f"topology {self.topology!r} is unknown or lacks its server")

    def _migrate(self, dsn: str) -> None:
        """Create the tables as an operator's deploy step would (``agentkernel db migrate``)."""
        migrate = self.deployment.spawn("db", "migrate", "--dsn", dsn)
        if migrate.wait(60) != 0:
            raise RuntimeError(f"agentkernel db migrate failed (exit {migrate.returncode})")

    @property
    def url(self) -> str:
        return self.deployment.url

    @property
    def broker(self) -> PrivateServer | None:
        """The server carrying the queues, when the suite runs it (a broker restart's target)."""
        return {"nats": self.nats, "redis": self.redis, "postgres": self.postgres}.get(
            self.topology
        )

    def start(self) -> None:
        """Start the IO process (or the embedded server) and the runners."""
        embedded = self.topology == "embedded"
        self.deployment.start_io(AGENTS if embedded else None)
        self.runners = [self.deployment.runner(AGENTS) for _ in range(self.runner_count)]
        self._supervisor.start()
        if self.nats is not None:
            self.trace = NatsTrace(self.nats.monitor_url, self.workdir / "nats-trace.jsonl")
            self.trace.start()

    # -- faults ------------------------------------------------------------------------------

    def kill_runner(self) -> None:
        """``kill -9`` of a random runner; the supervisor starts a new one."""
        with self._lock:
            i = random.randrange(len(self.runners))
            self.runners[i].send_signal(signal.SIGKILL)
        self.events.fault(f"kill -9 runner {i}")

    def roll_runner(self, i: int) -> threading.Thread:
        """Rolling restart of runner ``i``: start its replacement, then SIGTERM it.

        Returns at once, as an orchestrator goes on to the next replica while this one drains
        (an SQS runner finishes its long poll first: up to 20 s); the returned thread waits for
        the exit and records it.
        """
        with self._lock:
            old = self.runners[i]
            self.runners[i] = self.deployment.runner(AGENTS)
        self.events.fault(f"SIGTERM runner {i}")
        waiter = threading.Thread(
            target=self._terminate, args=(old, "runner"), name=f"drain-runner-{i}", daemon=True
        )
        waiter.start()
        return waiter

    def stop_runners(self) -> None:
        """SIGTERM every runner and keep them stopped until :meth:`start_runners`."""
        with self._lock:
            self._held.update(range(len(self.runners)))
            old = list(self.runners)
        self.events.fault("SIGTERM every runner")
        for proc in old:
            self._terminate(proc, "runner")

    def start_runners(self) -> None:
        """Start every runner again (with the deployment's settings as they are now)."""
        with self._lock:
            self.runners = [self.deployment.runner(AGENTS) for _ in range(self.runner_count)]
            self._held.clear()
        self.events.note("runners started")

    def roll_io(self) -> None:
        """SIGTERM the IO process (the embedded server), then start a new one on its port."""
        assert self.deployment.io is not None
        self.events.fault("SIGTERM io")
        self._terminate(self.deployment.io, "io")
        self.deployment.start_io(AGENTS if self.topology == "embedded" else None)

    def redis_outage(self, seconds: float) -> None:
        assert self.redis is not None, "a Redis outage needs the private Redis"
        self.events.fault(f"redis down {seconds:g}s")
        self.redis.stop()
        time.sleep(seconds)
        self.redis.start()

    def broker_restart(self, seconds: float) -> None:
        broker = self.broker
        assert broker is not None, f"{self.topology}: no private broker to restart"
        self.events.fault(f"{broker.name} restart ({seconds:g}s down)")
        broker.stop()
        time.sleep(seconds)
        broker.start()

    def _terminate(self, proc: subprocess.Popen[str], role: str) -> None:
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = proc.wait(DRAIN_BOUND)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            code = None  # hung: did not exit within the bound
        seconds = time.monotonic() - started
        with self.events.lock:
            self.events.exits.append(Exit(role, code, seconds))
        self.events.note(f"{role} exited {code} after {seconds:.1f}s")

    # -- supervision -------------------------------------------------------------------------

    def _supervise(self) -> None:
        while not self._stop.wait(SUPERVISE_EVERY):
            with self._lock:
                for i, proc in enumerate(self.runners):
                    if i in self._held or proc.poll() is None:
                        continue
                    if proc.returncode != -signal.SIGKILL:
                        self.events.crashes += 1
                    self.runners[i] = self.deployment.runner(AGENTS)
                    self.events.note(f"runner {i} restarted (exit {proc.returncode})")

    # -- end ---------------------------------------------------------------------------------

    def log_records(self) -> dict[str, int]:
        """Log records each process wrote, by log file name (a traceback is part of one), less
        the one line per finished turn (``agentkernel.turns``), which grows with the workload by
        design: the bound is on what faults make a process write."""
        counts = {}
        for log in self.deployment.logs:
            with log.open("rb") as f:
                counts[log.name] = sum(
                    1 for line in f if LOG_RECORD.match(line) and not TURN_LINE.search(line)
                )
        return counts

    def close(self) -> None:
        """Kill every process and server this cluster started (also after a failure)."""
        self._stop.set()
        if self.trace is not None:
            self.trace.close()
        if self._supervisor.is_alive():
            self._supervisor.join(5)
        self.deployment.close()
        if self.redis is not None:
            self.redis.stop()
        if self.nats is not None:
            self.nats.stop()
        if self.postgres is not None:
            self.postgres.close()


def stores_env(redis_url: str, tag: str) -> dict[str, str]:
    return {
        "AK_EXECUTION__RESPONSE_STORE__TYPE": "redis",
        "AK_EXECUTION__RESPONSE_STORE__REDIS__URL": redis_url,
        "AK_EXECUTION__RESPONSE_STORE__REDIS__PREFIX": f"chaos:{tag}:",
        "AK_SESSION__TYPE": "redis",
        "AK_SESSION__REDIS__URL": redis_url,
        "AK_SESSION__REDIS__PREFIX": f"chaos:{tag}:",
    }


def redis_env(url: str, tag: str) -> dict[str, str]:
    """Redis only: the queues on the stores' server (consumer groups made by ``auto_provision``)."""
    return {
        "AK_EXECUTION__QUEUES__TYPE": "redis",
        "AK_EXECUTION__QUEUES__REDIS__URL": url,
        "AK_EXECUTION__QUEUES__REDIS__PREFIX": f"chaos:{tag}:q:",
        "AK_EXECUTION__QUEUES__REDIS__AUTO_PROVISION": "true",
    }


def postgres_env(dsn: str) -> dict[str, str]:
    """Postgres only: the queues and both stores in the default schema, migrated beforehand."""
    env = {
        "AK_EXECUTION__QUEUES__TYPE": "postgres",
        "AK_EXECUTION__RESPONSE_STORE__TYPE": "postgres",
        "AK_SESSION__TYPE": "postgres",
    }
    for block in ("EXECUTION__QUEUES", "EXECUTION__RESPONSE_STORE", "SESSION"):
        env[f"AK_{block}__POSTGRES__DSN"] = dsn
    return env


def nats_env(url: str, tag: str) -> dict[str, str]:
    t = tag.upper()
    return {
        "AK_EXECUTION__QUEUES__TYPE": "nats",
        "AK_EXECUTION__QUEUES__NATS__URL": url,
        "AK_EXECUTION__QUEUES__NATS__INPUT_STREAM": f"CHAOS_IN_{t}",
        "AK_EXECUTION__QUEUES__NATS__INPUT_SUBJECT_PREFIX": f"chaos{t}.in",
        "AK_EXECUTION__QUEUES__NATS__OUTPUT_STREAM": f"CHAOS_OUT_{t}",
        "AK_EXECUTION__QUEUES__NATS__OUTPUT_SUBJECT_PREFIX": f"chaos{t}.out",
        "AK_EXECUTION__QUEUES__NATS__AUTO_PROVISION": "true",
    }


def sqs_env(moto_url: str, tag: str) -> dict[str, str]:
    import boto3

    sqs = boto3.client("sqs", **_boto_args(moto_url))

    def fifo(name: str, attributes: dict[str, str]) -> str:
        attributes = {"FifoQueue": "true", "VisibilityTimeout": str(SQS_VISIBILITY), **attributes}
        return str(sqs.create_queue(QueueName=f"{name}.fifo", Attributes=attributes)["QueueUrl"])

    dlq = fifo(f"chaos-dlq-{tag}", {})
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]
    # The application's default max_receive_count (3) is one below the redrive policy's.
    redrive = json.dumps({"deadLetterTargetArn": arn["QueueArn"], "maxReceiveCount": "4"})
    return {
        **servers.aws_env(moto_url),
        "AK_EXECUTION__QUEUES__TYPE": "sqs",
        "AK_EXECUTION__QUEUES__INPUT__URL": fifo(f"chaos-in-{tag}", {"RedrivePolicy": redrive}),
        "AK_EXECUTION__QUEUES__OUTPUT__URL": fifo(f"chaos-out-{tag}", {}),
    }


def _boto_args(moto_url: str) -> dict[str, Any]:
    env = servers.aws_env(moto_url)
    return {
        "endpoint_url": moto_url,
        "region_name": env["AWS_DEFAULT_REGION"],
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
    }


def kafka_env(bootstrap: str, redis_url: str, tag: str) -> dict[str, str]:
    return {
        "AK_EXECUTION__QUEUES__TYPE": "kafka",
        "AK_EXECUTION__QUEUES__KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "AK_EXECUTION__QUEUES__KAFKA__INPUT_TOPIC": f"chaos-in-{tag}",
        "AK_EXECUTION__QUEUES__KAFKA__OUTPUT_TOPIC": f"chaos-out-{tag}",
        "AK_EXECUTION__QUEUES__KAFKA__GROUP_ID": f"chaos-{tag}",
        "AK_EXECUTION__QUEUES__KAFKA__AUTO_PROVISION": "true",
        "AK_EXECUTION__QUEUES__KAFKA__BOOKKEEPING": "redis",
        "AK_EXECUTION__QUEUES__KAFKA__BOOKKEEPING_REDIS_URL": redis_url,
        "AK_EXECUTION__QUEUES__KAFKA__CONSUMER_CONFIG": json.dumps(TANSU_CONSUMER),
    }
