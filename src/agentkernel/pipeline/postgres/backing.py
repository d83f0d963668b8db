"""One store's hold on PostgreSQL: its pool, its schema's epoch and its sweeper of expired rows.

A store builds one :class:`Backing` and runs every call through it. The epoch
(:mod:`agentkernel.pipeline.postgres.schema`) is read when the store starts; a server that is
down then defers it to the first call, which raises the usual outage error until the server is
back. Statements that may find a record missing also select the epoch in the same round trip,
so telling a new record from a lost one costs nothing extra.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from psycopg import sql

from agentkernel.core.config.stores import PostgresStoreConfig
from agentkernel.core.errors import StoreDataLostError, StoreError, StoreUnavailableError
from agentkernel.pipeline.postgres.client import Connection, open_pool, pg_errors, pooled
from agentkernel.pipeline.postgres.schema import EXPIRING, establish, query_in

logger = logging.getLogger(__name__)

#: Rows one sweep statement deletes at most, so a large backlog never holds long locks.
SWEEP_BATCH = 5000
#: The sub-select every lookup adds to learn the epoch in the same round trip.
EPOCH = "(SELECT value FROM {s}.meta WHERE name = 'epoch')"


class Backing:
    """The pool, epoch and sweeper of one PostgreSQL store.

    Args:
        config: the store's block.
        key: the block's configuration key, for messages.
        unavailable: the store's outage error.
        failed: the store's error for anything else.
        tables: the tables whose expired rows this store's sweeper deletes.

    Raises:
        AKConfigError: the DSN is malformed, or the schema is missing or older and
            ``auto_provision`` is off.
    """

    def __init__(
        self,
        config: PostgresStoreConfig,
        key: str,
        *,
        unavailable: type[StoreError],
        failed: type[StoreError],
        tables: tuple[str, ...],
    ) -> None:
        self.config, self.key, self.schema = config, key, config.db_schema
        self.q = query_in(config.db_schema)
        self._unavailable, self._failed = unavailable, failed
        self.pool = open_pool(config, key)
        self.epoch: str | None = None
        self._lock = threading.Lock()
        self._sweeper = Sweeper(self, tuple(t for t in tables if t in EXPIRING))
        try:
            self.ensure()
        except StoreUnavailableError as exc:
            logger.warning("%s: PostgreSQL not checked at start-up (%s); on first use", key, exc)
        except BaseException:
            self.pool.close(timeout=2.0)  # not left for ``__del__`` to join (see the transport)
            raise
        self._sweeper.start()

    @contextmanager
    def connection(self, what: str) -> Iterator[Connection]:
        """A pooled connection, with psycopg errors mapped for ``what``."""
        with pooled(self.pool, self.errors(what)) as conn:
            yield conn

    def errors(self, what: str) -> AbstractContextManager[None]:
        """The error mapping of this store for ``what``."""
        return pg_errors(what, unavailable=self._unavailable, failed=self._failed)

    def ensure(self) -> str:
        """The epoch, read (and the schema checked) on first need."""
        with self._lock:
            if self.epoch is None:
                with self.connection("check of the schema") as conn:
                    self.epoch = establish(conn, self.schema, self.key, self.config.auto_provision)
            return self.epoch

    def check_miss(self, found: object, what: str) -> None:
        """A record of ``what`` is missing and the epoch read beside it is ``found``: raise
        unless the record is genuinely new.

        Raises:
            StoreDataLostError: the epoch is gone or is not the one this process started on.
        """
        if found != self.epoch:
            logger.error("%s: store epoch %s is now %s: data lost", self.key, self.epoch, found)
            raise StoreDataLostError(
                f"{self.key}: no record of {what}, and the store epoch {self.epoch} is "
                f"{'gone' if found is None else 'replaced'}: the database lost its data "
                "(restore it, or restart every process to accept the loss)"
            )

    def ping(self) -> None:
        """Readiness: the server answers, takes writes, and holds this process's epoch."""
        epoch = self.ensure()
        query = self.q(f"SELECT {EPOCH}, pg_is_in_recovery()")
        with self.connection("ping") as conn:
            row = conn.execute(query).fetchone()
        if row is not None and row[1]:
            raise self._unavailable(f"{self.key}: the server is a read-only standby")
        if row is None or row[0] != epoch:
            self.check_miss(None if row is None else row[0], "the readiness check")

    def sweep(self) -> int:
        """Delete this store's expired rows now (the sweeper does it every interval)."""
        return self._sweeper.sweep()

    def close(self) -> None:
        """Stop the sweeper and close the pool."""
        self._sweeper.stop()
        self.pool.close(timeout=2.0)


class Sweeper:
    """A thread deleting expired rows every ``sweep_interval`` seconds; reads already ignore
    them, so it only bounds the tables' size. Every process sweeps: deletes are idempotent."""

    def __init__(self, backing: Backing, tables: tuple[str, ...]) -> None:
        self._backing, self._tables = backing, tables
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="postgres-sweeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)

    def sweep(self) -> int:
        """Delete the expired rows of every table now; returns how many went."""
        total = 0
        for table in self._tables:
            query = sql.SQL(
                "DELETE FROM {t} WHERE ctid = ANY(ARRAY("
                "SELECT ctid FROM {t} WHERE expires_at <= now() LIMIT {n}))"
            ).format(t=sql.Identifier(self._backing.schema, table), n=sql.Literal(SWEEP_BATCH))
            with self._backing.connection(f"sweep of {table}") as conn:
                while not self._stop.is_set():
                    deleted = conn.execute(query).rowcount
                    total += max(deleted, 0)
                    if deleted < SWEEP_BATCH:
                        break
        return total

    def _run(self) -> None:
        while not self._stop.wait(self._backing.config.sweep_interval):
            try:
                self.sweep()
            except StoreError as exc:  # an outage: the next round tries again
                logger.warning("%s: sweep of expired rows failed: %s", self._backing.key, exc)
