"""Turn signals in DynamoDB, as items of the session table beside the session records.

Two kinds of item, keyed (``session_id``) so that no session key can take their place (a scoped
key starts with 32 hex digits and a ``/``, an unscoped one has no ``/``)::

    signals/open/<session key>   the session's open turns: one attribute o:<request id> per
                                 turn, holding when it was opened (microseconds since the
                                 epoch); n, raised by every write that opens a turn
    signals/turn/<request id>    started (the session key) and started_until, while the turn
                                 runs; stop (JSON) and stop_until, once a stop is asked

Both carry the table's TTL attribute ``expiry_time``, so DynamoDB deletes them once they no
longer count (it may take a while: every read compares the times itself). Times are the
writing process's clock, so the order of turns opened by two processes within their clocks'
skew may come out either way.

Atomic steps are single conditional writes: ``open`` adds its attribute unless it is already
live; ``open(exclusive=True)`` reads the session's item and writes only if ``n`` is still the
one it read (retrying on a lost race); ``stop`` and ``start`` write the turn's item only when
no stop holds (and, for a ``SUPERSEDE``, when the turn has not started in that session), so
they have exactly one winner. A refused write returns the item it was refused on, so every step
but ``start`` (which then opens the turn, a second write) is one request. ``stops`` reads the
turns' items with ``BatchGetItem``, 100 a request, retrying the keys DynamoDB leaves
unprocessed. ``close`` removes the turn's attribute and deletes its item (its stop has served:
the turn's reply is stored, and a cancel reads the reply first).

botocore errors are mapped as the session store maps them: throttling, a server error or an
unreachable endpoint is :class:`SessionStoreUnavailableError`, anything else
:class:`SessionStoreError`.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Collection, Iterator
from typing import Any

from agentkernel.core.botocore_errors import CONDITION_FAILED, botocore_errors, error_code
from agentkernel.core.errors import SessionStoreError, SessionStoreUnavailableError
from agentkernel.pipeline.turn_control.signals import (
    STALE_AFTER_SECONDS,
    Stop,
    StopKind,
    TurnSignals,
)

__all__ = ["DynamoDBTurnSignals"]

_errors = functools.partial(
    botocore_errors, unavailable=SessionStoreUnavailableError, failed=SessionStoreError
)
_OPEN_ITEM, _TURN_ITEM, _ENTRY = "signals/open/", "signals/turn/", "o:"
#: Keys one BatchGetItem reads, and items one BatchWriteItem deletes, at most (DynamoDB's caps).
BATCH_GET, BATCH_WRITE = 100, 25
#: Attempts of a batch whose unprocessed keys are retried, and of an exclusive open that keeps
#: losing its race, before the call is given up as an outage.
_ATTEMPTS = 8
_NAMES = {
    "#k": "session_id",
    "#n": "n",
    "#x": "expiry_time",
    "#started": "started",
    "#sunt": "started_until",
    "#stop": "stop",
    "#until": "stop_until",
}
#: Stale entries removed by one write at most (an update expression is at most 4 KB).
_TIDIED = 50
_NO_STOP = "(attribute_not_exists(#until) OR #until <= :now)"


class DynamoDBTurnSignals(TurnSignals):
    """Turn signals in the table of a :class:`DynamoDBSessionStore` (layout in the module
    docstring).

    Args:
        client: the session store's boto3 DynamoDB client.
        table: the session table.
        ttl: seconds a stop request is kept.
        stale_after: seconds an open turn that was never closed keeps counting as open.
    """

    def __init__(
        self,
        client: Any,
        table: str,
        ttl: float = 86400.0,
        stale_after: float = STALE_AFTER_SECONDS,
    ) -> None:
        super().__init__(ttl, stale_after)
        self._client, self._table = client, table
        self._stale_us = int(stale_after * 1_000_000)

    # -- open turns --------------------------------------------------------------------------

    def open(self, key: str, request_id: str, *, exclusive: bool = False) -> list[str]:
        if exclusive:
            return self._open_exclusive(key, request_id)
        now = _now_us()
        item = self._add(key, request_id, now, returns=True)
        return self._others(key, item, request_id, now)

    def _add(self, key: str, request_id: str, now: int, *, returns: bool) -> dict[str, Any]:
        """Open the turn unless it is open and live; the session's item after (``returns``)."""
        _, item = self._write(
            f"open of turn {request_id}",
            Key=_key(_OPEN_ITEM + key),
            UpdateExpression="SET #t = :now, #x = :x ADD #n :one",
            ConditionExpression="attribute_not_exists(#t) OR #t <= :oldest",
            ExpressionAttributeNames={"#t": _ENTRY + request_id, **_names("#n", "#x")},
            ExpressionAttributeValues={
                ":now": _n(now),
                ":oldest": _n(now - self._stale_us),
                ":x": _n(self._expiry(now, self.stale_after)),
                ":one": _n(1),
            },
            **({"ReturnValues": "ALL_NEW"} if returns else {}),
        )
        return item

    def _open_exclusive(self, key: str, request_id: str) -> list[str]:
        for _ in range(_ATTEMPTS):
            now = _now_us()
            item = self._read(key)
            others = self._others(key, item, request_id, now, tidy=False)
            if others or _live(item, request_id, now - self._stale_us):
                return others
            if self._claim(key, request_id, item, now):
                return []
        raise SessionStoreUnavailableError(
            f"DynamoDB open of turn {request_id}: lost {_ATTEMPTS} races for its session"
        )

    def _claim(self, key: str, request_id: str, item: dict[str, Any], now: int) -> bool:
        """Open the turn in a session whose ``item``, as read, holds no live turn, unless a turn
        was opened since (``n`` moved); the stale entries go with it. Whether it was opened."""
        version = item.get("n", {}).get("N")
        stale = [name for name in item if name.startswith(_ENTRY) and name != _ENTRY + request_id]
        stale = stale[:_TIDIED]
        names = {"#t": _ENTRY + request_id, **_names("#n", "#x")}
        names |= {f"#s{i}": name for i, name in enumerate(stale)}
        remove = f" REMOVE {', '.join(f'#s{i}' for i in range(len(stale)))}" if stale else ""
        values = {":now": _n(now), ":x": _n(self._expiry(now, self.stale_after)), ":one": _n(1)}
        if version is not None:
            values[":n"] = {"N": version}
        written, _ = self._write(
            f"open of turn {request_id}",
            Key=_key(_OPEN_ITEM + key),
            UpdateExpression="SET #t = :now, #x = :x ADD #n :one" + remove,
            ConditionExpression="attribute_not_exists(#n)" if version is None else "#n = :n",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )
        return written

    def _read(self, key: str) -> dict[str, Any]:
        with _errors(f"DynamoDB read of the open turns of session {key}"):
            reply = self._client.get_item(
                TableName=self._table, Key=_key(_OPEN_ITEM + key), ConsistentRead=True
            )
        return dict(reply.get("Item", {}))

    def _others(
        self, key: str, item: dict[str, Any], request_id: str, now: int, *, tidy: bool = True
    ) -> list[str]:
        """The live open turns of ``item`` but ``request_id``, oldest first; stale ones are
        removed from the item (``tidy``)."""
        oldest = now - self._stale_us
        turns = dict(_entries(item))
        if tidy and (stale := [(rid, at) for rid, at in turns.items() if at <= oldest]):
            self._drop(key, dict(stale[:_TIDIED]))
        live = sorted((at, rid) for rid, at in turns.items() if at > oldest and rid != request_id)
        return [rid for _, rid in live]

    def _drop(self, key: str, stale: dict[str, int]) -> None:
        """Remove stale entries, each only if it was not opened again meanwhile."""
        names = {f"#s{i}": _ENTRY + rid for i, rid in enumerate(stale)}
        values = {f":s{i}": _n(at) for i, at in enumerate(stale.values())}
        self._write(
            f"tidy of the open turns of session {key}",
            Key=_key(_OPEN_ITEM + key),
            UpdateExpression="REMOVE " + ", ".join(names),
            ConditionExpression=" AND ".join(f"#s{i} = :s{i}" for i in range(len(stale))),
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )

    # -- stops -------------------------------------------------------------------------------

    def stop(self, key: str, request_id: str, stop: Stop) -> Stop | None:
        now, condition = _now_us(), _NO_STOP
        values = {
            ":now": _n(now),
            ":stop": {"S": stop.encode()},
            ":until": _n(now + int(self.ttl * 1_000_000)),
            ":x": _n(self._expiry(now, max(self.ttl, self.stale_after))),
        }
        names = ["#stop", "#until", "#x"]
        if stop.kind is StopKind.SUPERSEDE:
            condition += (
                " AND (attribute_not_exists(#started) OR #started <> :key OR #sunt <= :now)"
            )
            values[":key"] = {"S": key}
            names += ["#started", "#sunt"]
        written, old = self._write(
            f"stop of turn {request_id}",
            Key=_key(_TURN_ITEM + request_id),
            UpdateExpression="SET #stop = :stop, #until = :until, #x = :x",
            ConditionExpression=condition,
            ExpressionAttributeNames=_names(*names),
            ExpressionAttributeValues=values,
        )
        if written:
            return stop
        return _held(old, now)  # None: a SUPERSEDE refused by the turn's start

    def start(self, key: str, request_id: str) -> Stop | None:
        now = _now_us()
        written, old = self._write(
            f"start of turn {request_id}",
            Key=_key(_TURN_ITEM + request_id),
            UpdateExpression="SET #started = :key, #sunt = :sunt, #x = :x",
            ConditionExpression=_NO_STOP,
            ExpressionAttributeNames=_names("#started", "#sunt", "#x", "#until"),
            ExpressionAttributeValues={
                ":now": _n(now),
                ":key": {"S": key},
                ":sunt": _n(now + self._stale_us),
                ":x": _n(self._expiry(now, self.stale_after)),
            },
        )
        if not written:
            return _held(old, now)
        self._add(key, request_id, now, returns=False)
        return None

    def stops(self, request_ids: Collection[str]) -> dict[str, Stop]:
        now, found = _now_us(), {}
        for chunk in _chunks(list(dict.fromkeys(request_ids)), BATCH_GET):
            for item in self._batch_get([_key(_TURN_ITEM + rid) for rid in chunk]):
                if (stop := _held(item, now)) is not None:
                    found[item["session_id"]["S"][len(_TURN_ITEM) :]] = stop
        return found

    def _batch_get(self, keys: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The items at ``keys`` (at most :data:`BATCH_GET`), retrying unprocessed keys."""
        items: list[dict[str, Any]] = []
        request = {
            self._table: {
                "Keys": keys,
                "ConsistentRead": True,
                "ProjectionExpression": "#k, #stop, #until",
                "ExpressionAttributeNames": _names("#k", "#stop", "#until"),
            }
        }
        for attempt in range(_ATTEMPTS):
            with _errors(f"DynamoDB read of the stops of {len(keys)} turns"):
                reply = self._client.batch_get_item(RequestItems=request)
            items += reply.get("Responses", {}).get(self._table, [])
            if not (request := reply.get("UnprocessedKeys") or {}):
                return items
            time.sleep(_backoff(attempt))
        raise SessionStoreUnavailableError(
            f"DynamoDB read of the stops of {len(keys)} turns: keys left unprocessed "
            f"{_ATTEMPTS} times (throttled)"
        )

    # -- ending ------------------------------------------------------------------------------

    def close(self, key: str, request_id: str) -> None:
        self._write(
            f"close of turn {request_id}",
            Key=_key(_OPEN_ITEM + key),
            UpdateExpression="REMOVE #t",
            ConditionExpression="attribute_exists(#t)",  # never create the item
            ExpressionAttributeNames={"#t": _ENTRY + request_id},
        )
        with _errors(f"DynamoDB close of turn {request_id}"):
            self._client.delete_item(TableName=self._table, Key=_key(_TURN_ITEM + request_id))

    def forget_session(self, key: str) -> None:
        with _errors(f"DynamoDB erase of the open turns of session {key}"):
            reply = self._client.delete_item(
                TableName=self._table, Key=_key(_OPEN_ITEM + key), ReturnValues="ALL_OLD"
            )
        turns = [_key(_TURN_ITEM + rid) for rid, _ in _entries(reply.get("Attributes", {}))]
        for chunk in _chunks(turns, BATCH_WRITE):
            self._batch_delete(chunk)

    def _batch_delete(self, keys: list[dict[str, Any]]) -> None:
        request = {self._table: [{"DeleteRequest": {"Key": key}} for key in keys]}
        for attempt in range(_ATTEMPTS):
            with _errors(f"DynamoDB erase of {len(keys)} turns"):
                reply = self._client.batch_write_item(RequestItems=request)
            if not (request := reply.get("UnprocessedItems") or {}):
                return
            time.sleep(_backoff(attempt))
        raise SessionStoreUnavailableError(
            f"DynamoDB erase of {len(keys)} turns: items left unprocessed {_ATTEMPTS} times"
        )

    def ping(self) -> None:
        with _errors("DynamoDB ping of the turn signals"):
            self._client.get_item(TableName=self._table, Key=_key(_OPEN_ITEM))

    # -- one conditional write ---------------------------------------------------------------

    def _write(self, what: str, **request: Any) -> tuple[bool, dict[str, Any]]:
        """One conditional ``UpdateItem``: whether it was written, and the item after it (with
        ``ReturnValues``) or the item that failed its condition."""
        try:
            with _errors(f"DynamoDB {what}"):
                reply = self._client.update_item(
                    TableName=self._table, ReturnValuesOnConditionCheckFailure="ALL_OLD", **request
                )
        except SessionStoreError as exc:
            if error_code(exc.__cause__) != CONDITION_FAILED:
                raise
            return False, dict(getattr(exc.__cause__, "response", {}).get("Item", {}))
        return True, dict(reply.get("Attributes", {}))

    @staticmethod
    def _expiry(now_us: int, seconds: float) -> int:
        """The TTL attribute (whole seconds since the epoch) ``seconds`` after ``now_us``."""
        return math.ceil(now_us / 1_000_000 + seconds)


def _names(*placeholders: str) -> dict[str, str]:
    """The attribute names of ``placeholders`` (DynamoDB refuses a name the request leaves
    unused)."""
    return {name: _NAMES[name] for name in placeholders}


def _now_us() -> int:
    return time.time_ns() // 1000


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def _key(name: str) -> dict[str, Any]:
    return {"session_id": {"S": name}}


def _entries(item: dict[str, Any]) -> Iterator[tuple[str, int]]:
    """The (request id, opened at) of each open turn an item of a session holds."""
    for name, value in item.items():
        if name.startswith(_ENTRY):
            yield name[len(_ENTRY) :], int(value["N"])


def _live(item: dict[str, Any], request_id: str, oldest: int) -> bool:
    value = item.get(_ENTRY + request_id)
    return value is not None and int(value["N"]) > oldest


def _held(item: dict[str, Any], now: int) -> Stop | None:
    """The stop a turn's item holds at ``now``, if any."""
    if "stop" not in item or int(item.get("stop_until", {}).get("N", "0")) <= now:
        return None
    return Stop.decode(item["stop"]["S"])


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _backoff(attempt: int) -> float:
    """Seconds to wait before retrying unprocessed keys (doubling from 50 ms, at most 1 s)."""
    return float(min(1.0, 0.05 * 2**attempt))
