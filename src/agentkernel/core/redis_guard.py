"""Losing a Redis store's data is loud, never silent: the epoch and the server checks.

Redis can lose what a store keeps without any error: restarted without persistence it comes
back empty, and with a ``maxmemory`` eviction policy it drops keys when it is full. A store that
then finds no record would take the session (or the turn's ticket) for a new one, its state,
owner and committed turns gone, and nobody told. So each Redis store keeps a guard:

- The **epoch**: a random id at ``<prefix>epoch``, written with ``NX`` by the first process that
  meets an empty store and read by every later one when it starts. A record that is missing
  while the epoch is still the one this process started with is genuinely new; one missing while
  the epoch is gone or changed may have been lost, so the store raises
  :class:`~agentkernel.core.errors.StoreDataLostError` instead of answering from an empty state.
  The epoch is never written again by a running process: restoring the data brings it back,
  restarting the processes accepts the loss (each adopts the epoch it then finds).
- The **server's settings**, when the store starts: an eviction policy other than
  ``noeviction`` can drop records without a trace, so it is refused with an
  :class:`~agentkernel.core.errors.AKConfigError` unless ``allow_eviction`` is set (then
  warned about); persistence off (no snapshots, no append-only file) is a warning, since the
  epoch catches the restart that empties the server.
- On every miss, every ``CHECK_SECONDS`` on the way of a store call, and on every readiness
  check: the epoch, the eviction policy and the server's count of evicted keys, in one round
  trip. Keys evicted since the store started, or an evicting policy set since, make every later
  miss suspect: a missing record can no longer be told from an evicted one.

Callers run these methods inside their own ``redis_errors`` block, which maps redis-py errors.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from agentkernel.core.errors import AKConfigError, StoreDataLostError
from agentkernel.core.redis_client import node_for, on_node

if TYPE_CHECKING:
    import redis

logger = logging.getLogger(__name__)

#: Seconds between two checks of the epoch and the eviction counters made on the way of a call
#: (one pipelined round trip each): how long a front may take a lost ticket for a new one.
CHECK_SECONDS = 2.0
#: Seconds the readiness probe's write lives (it only proves that Redis still takes writes).
PROBE_TTL_MS = 10_000


class RedisGuard:
    """The epoch and server checks of one Redis store.

    Args:
        client: the store's redis-py client.
        prefix: the store's key prefix; the epoch lives at ``<prefix>epoch``.
        key: the store's configuration key, for messages (``session.redis``).
        allow_eviction: run on a server whose eviction policy may drop records (warned about).
    """

    def __init__(
        self, client: redis.Redis, prefix: str, key: str, *, allow_eviction: bool = False
    ) -> None:
        self._redis = client
        self._epoch_key = f"{prefix}epoch"
        self._probe_key = f"{prefix}ready-probe"
        self._name = key
        self._allow_eviction = allow_eviction
        self.epoch: str | None = None
        self._evicted = 0  # the server's evicted_keys when this store started
        self._suspect: str | None = None  # why every miss is refused from now on
        self._lost_logged = False
        self._next_check = 0.0
        self.warnings: list[str] = []

    # -- start-up --------------------------------------------------------------------------

    def establish(self) -> None:
        """Adopt the store's epoch (creating it on an empty store) and check the server.

        Raises:
            AKConfigError: the server may evict records and ``allow_eviction`` is off.
        """
        policy, evicted, epoch = self._snapshot(full=True)
        if policy != "noeviction":
            self._evicting_at_start(str(policy))
        if self._persistent() is False:
            self._warn(
                "Redis persistence is off (no snapshots, no append-only file): a restart "
                "empties the store (its processes then refuse what it lost, loudly)"
            )
        if epoch is None:
            self._redis.set(self._epoch_key, uuid.uuid4().hex, nx=True)
            epoch = self._redis.get(self._epoch_key)
            logger.info("%s: new store epoch at %s (an empty store)", self._name, self._epoch_key)
        self._evicted = evicted
        self.epoch = None if epoch is None else _text(epoch)
        self._next_check = time.monotonic() + CHECK_SECONDS

    def _evicting_at_start(self, policy: str) -> None:
        text = (
            f"the Redis maxmemory-policy is {policy}: it may evict records, and a lost session "
            "could not be told from a new one"
        )
        if not self._allow_eviction:
            raise AKConfigError(
                f"{self._name}: {text}; set maxmemory-policy noeviction on the server, or "
                f"{self._name}.allow_eviction: true to accept that risk"
            )
        self._warn(f"{text} ({self._name}.allow_eviction is on)")

    def _warn(self, text: str) -> None:
        self.warnings.append(text)
        logger.warning("%s: %s", self._name, text)

    # -- on the way of each call -------------------------------------------------------------

    def ensure(self) -> None:
        """Establish the epoch if the start-up could not reach Redis; re-check when due."""
        if self.epoch is None:
            self.establish()
        elif time.monotonic() >= self._next_check:
            self._next_check = time.monotonic() + CHECK_SECONDS
            self._observe()

    def _observe(self, full: bool = True) -> bool:
        """Check the server's evictions (and, ``full``, its policy) and the epoch; whether the
        epoch is intact."""
        policy, evicted, epoch = self._snapshot(full)
        if self._suspect is None and not self._allow_eviction:
            if evicted > self._evicted:
                self._suspect_misses(f"Redis evicted {evicted - self._evicted} keys")
            elif policy not in ("noeviction", None):
                self._suspect_misses(f"the Redis maxmemory-policy became {policy}")
        elif evicted > self._evicted:
            logger.warning("%s: Redis evicted %s keys", self._name, evicted - self._evicted)
            self._evicted = evicted
        return self._compare(epoch)

    def _suspect_misses(self, reason: str) -> None:
        self._suspect = f"{reason} since this process started"
        logger.error(
            "%s: %s: a missing record may have been evicted, so every turn that finds none is "
            "refused (STORE_DATA_LOST) until the processes are restarted with noeviction",
            self._name,
            self._suspect,
        )

    def check_miss(self, what: str) -> None:
        """A record of ``what`` is missing: raise unless it is genuinely new.

        Raises:
            StoreDataLostError: the epoch is gone or changed, or keys were evicted.
        """
        intact = self._observe(full=False)  # one round trip, on a miss (a new session or ticket)
        if self._suspect is not None:
            raise StoreDataLostError(f"{self._name}: no record of {what}, and {self._suspect}")
        if not intact:
            raise StoreDataLostError(f"{self._name}: no record of {what}, and {self.lost}")

    @property
    def lost(self) -> str:
        """What a lost epoch means, for messages."""
        return f"the store epoch {self.epoch} is gone: Redis lost its data"

    def refuses_misses(self) -> bool:
        """Whether a miss is refused without reading the epoch (evictions were seen)."""
        return self._suspect is not None

    def probe(self) -> None:
        """Readiness: Redis takes a write (a full one raises ``OutOfMemoryError``), and its data
        is the data this process started on.

        Raises:
            StoreDataLostError: the epoch is gone or changed, or keys were evicted.
        """
        self._redis.set(self._probe_key, "1", px=PROBE_TTL_MS)
        if self.epoch is None:
            self.establish()
        self._next_check = time.monotonic() + CHECK_SECONDS
        intact = self._observe()
        if self._suspect is not None:
            raise StoreDataLostError(f"{self._name}: {self._suspect}")
        if not intact:
            raise StoreDataLostError(f"{self._name}: {self.lost}")

    def _compare(self, found: bytes | str | None) -> bool:
        """Whether ``found`` is this process's epoch; one log line when that changes."""
        intact = found is not None and _text(found) == self.epoch
        if intact and self._lost_logged:
            logger.warning("%s: the store epoch is back: its data was restored", self._name)
        elif not intact and not self._lost_logged:
            change = "is gone" if found is None else f"changed to {_text(found)}"
            logger.error(
                "%s: the store epoch %s %s: Redis lost its data (emptied, or restarted without "
                "persistence); turns that find no record are refused (STORE_DATA_LOST) until "
                "the data is restored or every process is restarted to accept the loss",
                self._name,
                self.epoch,
                change,
            )
        self._lost_logged = not intact
        return intact

    def _snapshot(self, full: bool) -> tuple[str | None, int, bytes | str | None]:
        """In one round trip: the eviction policy (``full`` only, else ``None``), the count of
        keys evicted since the server started, and the epoch."""

        def snapshot(node: redis.Redis) -> list[Any]:
            with node.pipeline(transaction=False) as pipe:
                pipe.info("stats")
                pipe.get(self._epoch_key)
                if full:
                    pipe.info("memory")
                return list(pipe.execute())

        # On a cluster: the node of the store's slot, which answers INFO beside the GET.
        stats, epoch, *memory = on_node(self._redis, self._epoch_key, snapshot)
        policy = str(memory[0].get("maxmemory_policy", "noeviction")) if memory else None
        return policy, int(stats.get("evicted_keys", 0)), epoch

    def _persistent(self) -> bool | None:
        """Whether the server persists its data (``None``: it does not say)."""
        import redis

        node = node_for(self._redis, self._epoch_key)  # on a cluster: the store's node
        if str(node.info("persistence").get("aof_enabled", "0")) == "1":
            return True
        try:
            save = node.config_get("save").get("save", "")
        except redis.ResponseError:  # CONFIG is often disabled on managed Redis: cannot tell
            return None
        return bool(str(save).strip())


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def start_guard(guard: RedisGuard, key: str) -> None:
    """Run ``guard.establish()`` when a store starts; an unreachable (or full) Redis defers it
    to the store's first call, which then raises its usual outage error.

    Raises:
        AKConfigError: the server may evict records (see :meth:`RedisGuard.establish`).
    """
    import redis

    try:
        guard.establish()
    except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.OutOfMemoryError) as exc:
        logger.warning("%s: Redis not checked at start-up (%s); checking on first use", key, exc)
