"""Keep a failure that repeats many times a second from flooding the log.

:class:`RateLimitedLog` writes the first record of a kind (a key such as ``"output:StoreError"``)
in full, counts the repeats for ``interval`` seconds, and writes one summary line with the count
when the kind shows up again after the interval (or on :meth:`flush`). An outage of a store that
fails hundreds of messages a second therefore costs a few lines, not thousands.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any


class RateLimitedLog:
    """Log the first occurrence of each key per interval, then a count of the repeats.

    Args:
        logger: where records go.
        interval: seconds during which repeats of a key are only counted.
        clock: monotonic time source in seconds (tests pass their own).
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._windows: dict[str, tuple[float, int]] = {}  # key -> (window start, repeats)
        self._lock = threading.Lock()

    def log(self, level: int, key: str, msg: str, *args: Any, exc_info: Any = None) -> bool:
        """Log ``msg % args`` unless ``key`` was logged less than ``interval`` seconds ago.

        Returns:
            whether the record was written (``False``: it was only counted).
        """
        now = self._clock()
        with self._lock:
            started, repeats = self._windows.get(key, (None, 0))
            if started is not None and now - started < self._interval:
                self._windows[key] = (started, repeats + 1)
                return False
            self._windows[key] = (now, 0)
        if repeats:
            self._summary(level, key, repeats, now - (started or now))
        self._logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def flush(self) -> None:
        """Write the summary of every key whose repeats were not reported yet."""
        now = self._clock()
        with self._lock:
            pending = [(k, s, n) for k, (s, n) in self._windows.items() if n]
            self._windows = {k: (s, 0) for k, (s, _) in self._windows.items()}
        for key, started, repeats in pending:
            self._summary(logging.WARNING, key, repeats, now - started)

    def _summary(self, level: int, key: str, repeats: int, seconds: float) -> None:
        self._logger.log(level, "%s: %s more like it in %.1fs (not logged)", key, repeats, seconds)
