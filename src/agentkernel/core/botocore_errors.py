"""The one classification of botocore exceptions, for every backend that talks to AWS.

A call AWS cannot serve right now (throttled, a server error, the endpoint unreachable or not
answering) is worth retrying; any other botocore error, such as a bad request or a missing
table, is not. Each backend says which of its own error classes those two outcomes become (a
response store raises :class:`~agentkernel.core.errors.StoreUnavailableError` /
``ResponseStoreError``, a session store ``SessionStoreUnavailableError`` /
``SessionStoreError``, SQS ``TransportError`` for both)::

    _errors = functools.partial(
        botocore_errors, unavailable=StoreUnavailableError, failed=ResponseStoreError
    )

    with _errors(f"DynamoDB read of {request_id}"):
        ...

A backend that treats one error code specially (a failed condition, a stale receipt handle)
catches our error and reads the code of its cause with :func:`error_code`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, NoRegionError
from botocore.exceptions import ConnectionError as EndpointError

from agentkernel.core.errors import AgentKernelError, AKConfigError

CONDITION_FAILED = "ConditionalCheckFailedException"
_TRANSIENT_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "ThrottlingException",
        "InternalServerError",
        "ServiceUnavailable",
    }
)


def client(service: str, key: str, **kwargs: Any) -> Any:
    """A boto3 client for ``service`` (``kwargs`` go to :func:`boto3.client`).

    Raises:
        AKConfigError: no region is configured, or a setting is invalid; the message names the
            config block ``key``.
    """
    try:
        return boto3.client(service, **kwargs)
    except NoRegionError as exc:
        where = f"{key}.region_name" if "region_name" in kwargs else f"{key} (AWS_REGION)"
        raise AKConfigError(f"{where}: no AWS region configured") from exc
    except (BotoCoreError, ValueError) as exc:
        raise AKConfigError(f"{key}: {exc}") from exc


def error_code(exc: BaseException | None) -> str:
    """The AWS error code of a :class:`ClientError` (``""`` for anything else)."""
    if not isinstance(exc, ClientError):
        return ""
    return str(exc.response.get("Error", {}).get("Code", ""))


def is_unavailable(exc: BaseException) -> bool:
    """Whether a botocore error says AWS cannot serve the call right now (throttled, a server
    error, unreachable): worth retrying, unlike a bad request."""
    if isinstance(exc, ClientError):
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return error_code(exc) in _TRANSIENT_CODES or status >= 500
    return isinstance(exc, (EndpointError, HTTPClientError))


@contextmanager
def botocore_errors(
    operation: str,
    *,
    unavailable: type[AgentKernelError],
    failed: type[AgentKernelError],
    unreadable: bool = False,
) -> Iterator[None]:
    """Turn botocore exceptions raised in the block into ``unavailable`` or ``failed``.

    Args:
        operation: what the block does, with the service, for the message
            ("DynamoDB read of r1").
        unavailable: raised when :func:`is_unavailable` says so.
        failed: raised for any other botocore error.
        unreadable: also turn an item that does not decode (``ValueError``, ``KeyError``,
            ``TypeError``) into ``failed``.
    """
    try:
        yield
    except (BotoCoreError, ClientError) as exc:
        kind = unavailable if is_unavailable(exc) else failed
        raise kind(f"{operation} failed: {error_code(exc) or exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        if not unreadable:
            raise
        raise failed(f"{operation}: unreadable item: {exc!r}") from exc


@contextmanager
def table_check(
    table: str,
    key: str,
    *,
    unavailable: type[AgentKernelError],
    failed: type[AgentKernelError],
) -> Iterator[None]:
    """:func:`botocore_errors` for a check of ``table``, where a table that does not exist is a
    configuration error naming the config block ``key``: retrying cannot make it appear.

    Raises:
        AKConfigError: the table does not exist.
    """
    try:
        with botocore_errors(
            f"DynamoDB check of table {table}", unavailable=unavailable, failed=failed
        ):
            yield
    except AgentKernelError as exc:
        if error_code(exc.__cause__) != "ResourceNotFoundException":
            raise
        raise AKConfigError(
            f"{key}.table_name: DynamoDB table '{table}' does not exist; create it (Terraform "
            "modules/tables) before starting - agentkernel never creates production tables"
        ) from exc.__cause__
