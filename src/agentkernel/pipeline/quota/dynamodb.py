"""The per-identity quota ledger in DynamoDB, shared by every front using the DynamoDB store
(Lambda request handlers, ECS tasks).

One item per identity in the response table, keyed ``#quota#<digest of the identity>``:

- ``unread``: a map of request id to expiry (Unix seconds). A turn is admitted by one
  ``UpdateItem`` that sets its entry on the condition that ``size(unread)`` is under the cap (or
  that the entry is there already: a retry), so any number of fronts share one cap. Reading the
  reply removes the entry; an entry past its expiry no longer counts, and expired entries are
  removed once they fill the map. With no cap on unread turns nothing is written.
- ``qi<k>``/``qb<k>``: stored bytes in a ring of :data:`BUCKETS` + 1 slots. Time is cut into
  buckets of ``ttl / BUCKETS`` seconds; slot ``k`` holds the index (``qi<k>``) and the byte total
  (``qb<k>``, grown with ``ADD``) of one bucket, and a write that finds an ended bucket in its
  slot starts the slot afresh, so the item never grows. Bytes count until their bucket's end
  plus the TTL: at most one bucket (a twelfth of the TTL) longer than the reply they stand for.
- ``expiry_time``: the table's TTL attribute, pushed past every entry by each write, so the item
  of an identity that goes quiet is removed by DynamoDB.

DynamoDB runs no scripts, so the byte total is checked from a consistent read before the
conditional write, as the Redis script checks it before its write. A reply stored twice (an
OUTPUT message delivered again) counts twice until its bucket ends, where Redis replaces the
size under the same key; the error is on the side of the cap. Errors are mapped as the store's
are (:mod:`agentkernel.core.botocore_errors`): throttling or an unreachable endpoint raises
:class:`StoreUnavailableError`, anything else :class:`ResponseStoreError`.
"""

from __future__ import annotations

import functools
import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentkernel.core.botocore_errors import CONDITION_FAILED, botocore_errors, error_code
from agentkernel.core.errors import ResponseStoreError, StoreUnavailableError
from agentkernel.pipeline.quota import Quota, QuotaLedger

__all__ = ["BUCKETS", "TTL_ATTRIBUTE", "DynamoDBQuotaLedger"]

#: The attribute DynamoDB's TTL deletes expired items by, shared with the response store's
#: table (the ledger's items live in it).
TTL_ATTRIBUTE = "expiry_time"

#: Buckets per TTL that stored bytes are counted in; the ring has one slot more.
BUCKETS = 12
_KEY_PREFIX = "#quota#"
#: Conditional writes tried per call before giving up on a contended item.
_ATTEMPTS = 5
#: Expired entries removed by one write (each is a path and a condition in the expressions).
_PRUNE_BATCH = 50
_errors = functools.partial(
    botocore_errors, unavailable=StoreUnavailableError, failed=ResponseStoreError, unreadable=True
)


@dataclass
class _Held:
    """What one identity's item says it holds at ``now``."""

    unread: dict[str, float] = field(default_factory=dict)  # live entries
    expired: dict[str, str] = field(default_factory=dict)  # entry -> stored value (N text)
    has_map: bool = False
    bytes_total: int = 0
    bytes_end: float = math.inf  # when the oldest bucket holding bytes ends

    @classmethod
    def of(cls, item: dict[str, Any], now: float, width: float) -> _Held:
        held = cls(has_map="unread" in item)
        for request_id, value in item.get("unread", {}).get("M", {}).items():
            expiry = float(value["N"])
            if expiry > now:
                held.unread[request_id] = expiry
            else:
                held.expired[request_id] = value["N"]
        for slot in range(BUCKETS + 1):
            if f"qi{slot}" not in item:
                continue
            end = (int(item[f"qi{slot}"]["N"]) + 1 + BUCKETS) * width
            size = int(item.get(f"qb{slot}", {"N": "0"})["N"])
            if end > now and size > 0:
                held.bytes_total += size
                held.bytes_end = min(held.bytes_end, end)
        return held

    def refusal(self, quota: Quota, now: float) -> float | None:
        """Seconds until the oldest entry holding a cap ends, or ``None`` under both caps."""
        if quota.unread_turns is not None and len(self.unread) >= quota.unread_turns:
            return min(self.unread.values()) - now
        if quota.reply_bytes is not None and self.bytes_total >= quota.reply_bytes:
            return self.bytes_end - now
        return None


class DynamoDBQuotaLedger(QuotaLedger):
    """Quota counts in the DynamoDB table of the response store.

    Args:
        client: the store's boto3 DynamoDB client.
        table_name: the store's table (partition key ``request_id``).
        ttl: the store's TTL, in seconds.
    """

    #: One item holds the unread entries; 5,000 of them stay well under DynamoDB's 400 KB.
    max_unread_turns: ClassVar[int | None] = 5000

    def __init__(self, client: Any, table_name: str, ttl: float) -> None:
        super().__init__(ttl)
        self._client, self._table = client, table_name
        self._width = ttl / BUCKETS

    def admit(self, owner: str, request_id: str, quota: Quota) -> float | None:
        for _ in range(_ATTEMPTS):
            now = time.time()
            held = _Held.of(self._item(owner, request_id), now, self._width)
            if request_id not in held.unread and (wait := held.refusal(quota, now)) is not None:
                return wait
            if quota.unread_turns is None:
                return None
            if self._count_unread(owner, request_id, quota.unread_turns, held, now):
                return None
        return 1.0  # every attempt lost the race for this identity's item: retry in a second

    def read(self, owner: str, request_id: str) -> None:
        self._update(
            owner,
            f"quota release of {request_id}",
            "REMOVE unread.#r",
            "attribute_exists(unread.#r)",  # already gone: nothing to do
            {"#r": request_id},
            {},
        )

    def stored(self, owner: str, key: str, size: int) -> None:
        now = time.time()
        bucket = int(now // self._width)
        slot = bucket % (BUCKETS + 1)
        names = {"#i": f"qi{slot}", "#b": f"qb{slot}", "#x": TTL_ATTRIBUTE}
        values = {":b": _n(bucket), ":s": _n(size), ":x": _n(self._expiry(now))}
        operation = f"quota count of {key}"
        for _ in range(_ATTEMPTS):
            # the slot holds this bucket (or none yet): add to it
            add = "SET #i = if_not_exists(#i, :b), #x = :x ADD #b :s"
            fits = "attribute_not_exists(#i) OR #i >= :b"
            if self._update(owner, operation, add, fits, names, values):
                return
            # the slot holds an ended bucket: start it afresh with this one
            restart = "SET #i = :b, #b = :s, #x = :x"
            if self._update(owner, operation, restart, "#i < :b", names, values):
                return
        raise ResponseStoreError(f"{operation}: the quota item kept changing; not counted")

    # -- the steps ---------------------------------------------------------------------------

    def _count_unread(self, owner: str, request_id: str, cap: int, held: _Held, now: float) -> bool:
        """One conditional write counting ``request_id``; ``False`` when it must be read again."""
        operation = f"quota check of {request_id}"
        names = {"#x": TTL_ATTRIBUTE}
        entry, expiry = {"N": f"{now + self.ttl:.3f}"}, _n(self._expiry(now))
        if not held.has_map:  # a new (or expired and removed) item
            values = {":m": {"M": {request_id: entry}}, ":x": expiry}
            create = "SET unread = :m, #x = :x"
            return self._update(
                owner, operation, create, "attribute_not_exists(unread)", names, values
            )
        full = len(held.unread) + len(held.expired) >= cap
        if full and held.expired and request_id not in held.unread:
            self._prune(owner, operation, held.expired)
            return False
        names["#r"] = request_id
        values = {":e": entry, ":x": expiry, ":c": _n(cap)}
        condition = "size(unread) < :c OR attribute_exists(unread.#r)"
        return self._update(
            owner, operation, "SET unread.#r = :e, #x = :x", condition, names, values
        )

    def _prune(self, owner: str, operation: str, expired: dict[str, str]) -> None:
        """Remove expired entries, each only if it still holds the expiry that was read (a retry
        may have counted it again since)."""
        batch = list(expired.items())[:_PRUNE_BATCH]
        names = {f"#e{i}": request_id for i, (request_id, _) in enumerate(batch)}
        values = {f":e{i}": {"N": value} for i, (_, value) in enumerate(batch)}
        removals = ", ".join(f"unread.#e{i}" for i in range(len(batch)))
        condition = " AND ".join(f"unread.#e{i} = :e{i}" for i in range(len(batch)))
        self._update(owner, operation, f"REMOVE {removals}", condition, names, values)

    def _item(self, owner: str, request_id: str) -> dict[str, Any]:
        with _errors(f"DynamoDB quota read for {request_id}"):
            reply = self._client.get_item(
                TableName=self._table, Key=self._key(owner), ConsistentRead=True
            )
        return reply.get("Item") or {}

    def _update(
        self,
        owner: str,
        operation: str,
        expression: str,
        condition: str,
        names: dict[str, str],
        values: dict[str, Any],
    ) -> bool:
        """One conditional ``UpdateItem``; ``False`` when its condition failed."""
        extra: dict[str, Any] = {"ExpressionAttributeValues": values} if values else {}
        try:
            with _errors(f"DynamoDB {operation}"):
                self._client.update_item(
                    TableName=self._table,
                    Key=self._key(owner),
                    UpdateExpression=expression,
                    ConditionExpression=condition,
                    ExpressionAttributeNames=names,
                    **extra,
                )
        except ResponseStoreError as exc:
            if error_code(exc.__cause__) != CONDITION_FAILED:
                raise
            return False
        return True

    def _key(self, owner: str) -> dict[str, Any]:
        digest = hashlib.sha256(owner.encode()).hexdigest()[:32]
        return {"request_id": {"S": _KEY_PREFIX + digest}}

    def _expiry(self, now: float) -> int:
        """The item's TTL: past every entry a write at ``now`` makes (a bucket's end + TTL)."""
        return math.ceil(now + self.ttl + self._width) + 1


def _n(number: int) -> dict[str, str]:
    return {"N": str(number)}
