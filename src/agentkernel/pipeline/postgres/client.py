"""Connections to PostgreSQL for the stores, and the one place psycopg errors are mapped.

Every store call runs inside :func:`pg_errors`, which turns a psycopg exception into the store
error tree (:mod:`agentkernel.core.errors`) with ``from exc``:

- a connection that cannot be opened or was lost, a pool with no free connection after
  ``connect_timeout``, a statement cancelled by ``statement_timeout``, a server shutting down or
  a read-only standby: the store's *unavailable* error (worth retrying);
- a server out of disk or memory: :class:`StoreFullError` (also worth retrying);
- a table or schema that no longer exists after start-up: :class:`StoreDataLostError` (someone
  dropped what the store relied on);
- anything else: the store's *failed* error.

Messages name the operation and the server's primary message, never a value written.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress

import psycopg
from psycopg import errors as pg
from psycopg_pool import ConnectionPool, PoolTimeout

from agentkernel.core.config.stores import PostgresStoreConfig
from agentkernel.core.errors import AKConfigError, StoreDataLostError, StoreFullError

logger = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[object, ...]]

#: Extra seconds the client waits on a silent connection beyond the statement timeout.
SILENCE_GRACE = 2.0


def conninfo(config: PostgresStoreConfig, key: str) -> str:
    """The libpq connection string of ``config``, with the timeouts applied.

    Raises:
        AKConfigError: the DSN is not a connection string or URL (the DSN is not echoed: it
            may hold a password).
    """
    statement_ms = int(config.statement_timeout * 1000)
    try:
        return psycopg.conninfo.make_conninfo(
            config.dsn,
            connect_timeout=max(2, math.ceil(config.connect_timeout)),  # libpq: whole s, >= 2
            options=f"-c statement_timeout={statement_ms} -c lock_timeout={statement_ms}",
            # A server that stops answering mid-statement is given up on, not waited for.
            tcp_user_timeout=statement_ms + int(SILENCE_GRACE * 1000),
            application_name="agentkernel",
        )
    except psycopg.ProgrammingError as exc:
        raise AKConfigError(
            f"{key}.dsn: not a libpq connection string or postgresql:// URL"
        ) from exc


def open_pool(config: PostgresStoreConfig, key: str) -> ConnectionPool:
    """A pool of autocommit connections to ``config``'s server, opened without waiting, so a
    server down at start-up fails the first call after ``connect_timeout`` instead.

    Raises:
        AKConfigError: the DSN is malformed.
    """
    pool: ConnectionPool = ConnectionPool(
        conninfo(config, key),
        min_size=1,
        max_size=config.pool_size,
        timeout=config.connect_timeout,
        kwargs={"autocommit": True},
        open=False,
        name=key,
    )
    pool.open(wait=False)
    return pool


@contextmanager
def pg_errors(
    what: str,
    *,
    unavailable: type[Exception],
    failed: type[Exception],
    lost: type[Exception] = StoreDataLostError,
    full: type[Exception] = StoreFullError,
) -> Iterator[None]:
    """Map psycopg exceptions raised in the block (see the module docstring).

    Args:
        what: the operation, for the message ("read of session s-1").
        unavailable: raised for connection trouble and timeouts.
        failed: raised for any other database error.
        lost: raised when a table or the schema is gone.
        full: raised when the server is out of disk or memory.
    """
    try:
        yield
    except (pg.UndefinedTable, pg.InvalidSchemaName) as exc:
        raise lost(
            f"{what}: {_primary(exc)}: the tables are gone; restore them, or run "
            "'agentkernel db migrate' and restart the processes to accept the loss"
        ) from exc
    except pg.InsufficientResources as exc:
        raise full(f"{what}: PostgreSQL refuses writes: {_primary(exc)}") from exc
    except (psycopg.OperationalError, pg.ReadOnlySqlTransaction) as exc:
        raise unavailable(f"{what}: PostgreSQL unavailable: {_primary(exc)}") from exc
    except psycopg.Error as exc:
        raise failed(f"{what}: PostgreSQL failed: {_primary(exc)}") from exc


@contextmanager
def pooled(pool: ConnectionPool, errors: AbstractContextManager[None]) -> Iterator[Connection]:
    """A connection of ``pool`` inside ``errors`` (a :func:`pg_errors` block).

    A connection that broke (the server restarted, or the network cut it) makes the pool
    check its idle connections at once, so the calls after this one get working ones instead
    of each failing on another dead connection.
    """
    with errors:
        try:
            with pool.connection() as conn:
                yield conn
        except psycopg.OperationalError as exc:
            if not isinstance(exc, PoolTimeout | pg.QueryCanceled):
                with suppress(psycopg.Error):
                    pool.check()
            raise


def _primary(exc: psycopg.Error) -> str:
    diag = getattr(exc, "diag", None)
    primary = None if diag is None else diag.message_primary
    text = primary or (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
