"""``agentkernel db migrate``: create or upgrade the tables of the PostgreSQL stores and queues.

The migrations are versioned (:mod:`agentkernel.pipeline.postgres.schema`); running the
command again applies only what is missing, so it belongs in a deployment's release step.
Without ``--dsn`` it migrates every PostgreSQL block the configuration names (the transport,
the response store, the session store; once each database and schema).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError

from agentkernel.core.config.root import AKConfig
from agentkernel.core.config.stores import PostgresStoreConfig
from agentkernel.core.errors import AKConfigError, StoreError, StoreUnavailableError
from agentkernel.core.extras import require_extra

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Add the ``db`` command to the CLI's subparsers ``sub``."""
    db = sub.add_parser("db", help="manage the PostgreSQL tables of the stores")
    actions = db.add_subparsers(dest="db_command", required=True)
    migrate = actions.add_parser(
        "migrate", help="create or upgrade the tables (idempotent; run before starting)"
    )
    migrate.add_argument(
        "--dsn", help="PostgreSQL URL; default: the PostgreSQL blocks of the config"
    )
    migrate.add_argument("--schema", help="schema to migrate with --dsn (default agentkernel)")
    migrate.add_argument("--config", help="config.yaml to read (default ./config.yaml)")


def run(args: argparse.Namespace) -> int:
    """Run ``db migrate``; returns the exit status (1: the server failed).

    Raises:
        AKConfigError: bad arguments, or a configuration without a PostgreSQL store.
    """
    targets = _targets(args)
    with require_extra("postgres", "agentkernel db migrate"):
        import psycopg

        from agentkernel.pipeline.postgres.client import conninfo, pg_errors
        from agentkernel.pipeline.postgres.schema import current_version, migrate
    for key, config in targets:
        errors = pg_errors(
            f"migration of schema {config.db_schema}",
            unavailable=StoreUnavailableError,
            failed=StoreError,
        )
        try:
            with errors, psycopg.connect(conninfo(config, key), autocommit=True) as conn:
                applied = migrate(conn, config.db_schema)
                version = current_version(conn, config.db_schema)
        except StoreError as exc:
            print(f"agentkernel: {exc}", file=sys.stderr)
            return 1
        done = f"applied {', '.join(map(str, applied))}" if applied else "nothing to apply"
        print(f"{key}: schema {config.db_schema} at version {version} ({done})")
    return 0


def _targets(args: argparse.Namespace) -> list[tuple[str, PostgresStoreConfig]]:
    if args.dsn is not None:
        settings = {"dsn": args.dsn} | ({"db_schema": args.schema} if args.schema else {})
        try:
            return [("--dsn", PostgresStoreConfig.model_validate(settings))]
        except ValidationError as exc:
            problem = exc.errors()[0]
            raise AKConfigError(f"--schema: {problem['msg']}") from exc
    if args.schema is not None:
        raise AKConfigError("--schema: only with --dsn (the config names each store's schema)")
    config = AKConfig.load(args.config)
    blocks = (
        ("execution.queues", config.execution.queues),
        ("execution.response_store", config.execution.response_store),
        ("session", config.session),
    )
    found: dict[tuple[str, str], tuple[str, PostgresStoreConfig]] = {}
    for key, block in blocks:
        pg = getattr(block, "postgres", None)
        if block.type == "postgres" and pg is not None:
            found.setdefault((pg.dsn, pg.db_schema), (f"{key}.postgres", pg))
    if not found:
        raise AKConfigError(
            "agentkernel db migrate: the configuration has no PostgreSQL block "
            "(execution.queues.type, execution.response_store.type or session.type: postgres); "
            "pass --dsn"
        )
    return list(found.values())
