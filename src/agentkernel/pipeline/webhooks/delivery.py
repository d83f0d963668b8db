"""Sending webhooks in the background: a bounded backlog drained by a few owned threads.

The response handler hands each final reply that names a webhook to
:meth:`WebhookDispatcher.submit`, which only queues it and returns, so a slow or dead receiver
never holds up the OUTPUT consumer or the reply itself. Worker threads (started on the first
webhook) take deliveries as they fall due; a delivery waiting for its next try holds no thread.
Connection errors, timeouts, 5xx and 429 are tried again with exponential backoff and jitter (a
longer ``Retry-After`` wins) until ``max_delivery_seconds`` after the reply arrived; any other
answer ends it at once. Before each attempt the URL is checked again against this process's
configuration and its host resolved anew, and the POST goes to an address that check accepted.

Every outcome is counted in ``agentkernel_webhook_deliveries_total{outcome}``: ``delivered``,
``retried`` (once per retry scheduled), ``failed`` (refused, a final answer, or out of time) and
``dropped`` (the backlog was full, or the process stopped with the delivery still held).
"""

from __future__ import annotations

import hashlib
import heapq
import http.client
import itertools
import json
import logging
import random
import ssl
import threading
import time
from dataclasses import dataclass, field

from agentkernel.core.config.webhooks import WebhooksConfig
from agentkernel.core.log_limit import RateLimitedLog
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.webhooks.sender import Answer, Timeouts, post
from agentkernel.pipeline.webhooks.signing import (
    ATTEMPT_HEADER,
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    sign,
)
from agentkernel.pipeline.webhooks.urls import WebhookRefused, checked_addresses
from agentkernel.pipeline.wire.records import ResponseRecord

logger = logging.getLogger(__name__)

#: Seconds a stopping process waits for the webhooks it still holds.
DRAIN_SECONDS = 2.0
#: Longest wait between two attempts, in seconds (before ``Retry-After``).
MAX_RETRY_DELAY_SECONDS = 60.0
_DELIVERIES = "agentkernel_webhook_deliveries_total"
_SECONDS = "agentkernel_webhook_delivery_seconds"
_PENDING = "agentkernel_webhooks_pending"


@dataclass(order=True)
class _Delivery:
    """One reply to POST, ordered by when its next attempt is due (monotonic seconds)."""

    due: float
    seq: int
    url: str = field(compare=False)
    record: ResponseRecord = field(compare=False)
    received: float = field(compare=False)
    attempts: int = field(default=0, compare=False)
    body: bytes = field(default=b"", compare=False)
    delivery_id: str = field(default="", compare=False)

    def prepare(self) -> None:
        """Build the JSON body once; equal replies get equal bytes and so the same id."""
        if self.body:
            return
        record = self.record
        doc = {
            "type": "turn.finished",
            "request_id": record.request_id,
            "session_id": record.session_id,
            "status_code": record.status_code,
            "body": record.body,
        }
        self.body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        digest = hashlib.sha256(record.request_id.encode() + b"\n" + self.body)
        self.delivery_id = digest.hexdigest()[:32]


class WebhookDispatcher:
    """Posts final replies to their webhooks from background threads.

    Args:
        config: the ``api.webhooks`` settings of this process.
        tls: the TLS context for https receivers (default: the system's trusted CAs).
    """

    def __init__(self, config: WebhooksConfig, tls: ssl.SSLContext | None = None) -> None:
        self.config = config
        self._tls = tls  # made on the first https POST: loading the CAs costs a cold start
        self._timeouts = Timeouts(config.connect_timeout, config.read_timeout)
        self._heap: list[_Delivery] = []
        self._busy = 0
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._log = RateLimitedLog(logger, interval=60.0)

    # -- intake ---------------------------------------------------------------------------------

    def submit(self, url: str, record: ResponseRecord) -> bool:
        """Queue ``record`` for ``url`` and return at once.

        Returns:
            whether it was taken (``False``: webhooks are off here, the backlog is full or the
            dispatcher is closed; logged and counted).
        """
        if self.config.secret is None:
            self._log.log(
                logging.WARNING,
                "no-secret",
                "reply of request %s names a webhook but api.webhooks.secret is not set in "
                "this process; not sent",
                record.request_id,
            )
            METRICS.inc(_DELIVERIES, outcome="failed")
            return False
        now = time.monotonic()
        with self._cond:
            full = self._stopping or len(self._heap) + self._busy >= self.config.max_pending
            if not full:
                heapq.heappush(self._heap, _Delivery(now, next(self._seq), url, record, now))
                self._start_workers()
                self._cond.notify()
                self._gauge()
        if full:
            self._drop(record.request_id)
        return not full

    def _drop(self, request_id: str) -> None:
        METRICS.inc(_DELIVERIES, outcome="dropped")
        self._log.log(
            logging.WARNING,
            "backlog-full",
            "webhook of request %s dropped: %s webhooks already held (api.webhooks.max_pending) "
            "or the process is stopping; further drops are counted in %s",
            request_id,
            self.config.max_pending,
            _DELIVERIES,
        )

    def _start_workers(self) -> None:
        """Start the worker threads on the first webhook (caller holds the lock)."""
        if self._threads:
            return
        for index in range(self.config.max_concurrent):
            thread = threading.Thread(target=self._work, name=f"webhook-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def pending(self) -> int:
        """Webhooks held: being sent or waiting for their next attempt."""
        with self._cond:
            return len(self._heap) + self._busy

    def _gauge(self) -> None:
        METRICS.set(_PENDING, len(self._heap) + self._busy)

    # -- lifecycle ------------------------------------------------------------------------------

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no webhook is held; returns whether none is."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._heap or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = DRAIN_SECONDS) -> None:
        """Send what can be sent within ``timeout`` seconds, then stop; the rest are dropped."""
        self.drain(timeout)
        with self._cond:
            self._stopping = True
            left = self._heap
            self._heap = []
            self._cond.notify_all()
            self._gauge()
        if left:
            METRICS.inc(_DELIVERIES, len(left), outcome="dropped")
            ids = ", ".join(d.record.request_id for d in left[:10])
            logger.warning("stopping with %s webhooks unsent (requests %s ...)", len(left), ids)
        for thread in self._threads:
            thread.join(0.1)

    # -- the workers ----------------------------------------------------------------------------

    def _work(self) -> None:
        while (delivery := self._next()) is not None:
            try:
                self._attempt(delivery)
            except Exception:  # a bug must not end the thread: count it and go on
                logger.exception("webhook of request %s failed", delivery.record.request_id)
                self._finish(delivery, "failed")
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()
                    self._gauge()

    def _next(self) -> _Delivery | None:
        """The next delivery due, waiting for it; ``None`` once stopping."""
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                if self._heap and self._heap[0].due <= now:
                    self._busy += 1
                    return heapq.heappop(self._heap)
                self._cond.wait(self._heap[0].due - now if self._heap else None)
        return None

    def _attempt(self, delivery: _Delivery) -> None:
        delivery.attempts += 1
        request_id = delivery.record.request_id
        try:
            target, addresses = checked_addresses(delivery.url, self.config)
        except WebhookRefused as exc:
            if exc.reason == "unresolvable":  # the resolver may answer next time
                self._retry_or_fail(delivery, None, str(exc))
                return
            logger.warning("webhook of request %s refused at delivery: %s", request_id, exc)
            self._finish(delivery, "failed")
            return
        delivery.prepare()
        if self._tls is None:
            self._tls = ssl.create_default_context()
        try:
            answer = post(
                target, addresses, delivery.body, self._headers(delivery), self._timeouts, self._tls
            )
        except (OSError, http.client.HTTPException) as exc:
            self._retry_or_fail(delivery, None, f"{target.host}: {type(exc).__name__}: {exc}")
            return
        self._answered(delivery, answer, target.host)

    def _answered(self, delivery: _Delivery, answer: Answer, host: str) -> None:
        if 200 <= answer.status < 300:
            self._finish(delivery, "delivered")
        elif answer.status == 429 or answer.status >= 500:
            self._retry_or_fail(delivery, answer.retry_after, f"{host} answered {answer.status}")
        else:
            logger.warning(
                "webhook of request %s: %s answered %s; not retried",
                delivery.record.request_id,
                host,
                answer.status,
            )
            self._finish(delivery, "failed")

    def _headers(self, delivery: _Delivery) -> dict[str, str]:
        secret = self.config.secret
        assert secret is not None  # submit() refuses deliveries without one
        now = int(time.time())
        return {
            "Content-Type": "application/json",
            "User-Agent": "agentkernel-webhooks/1",
            SIGNATURE_HEADER: sign(delivery.body, secret.get_secret_value(), now),
            TIMESTAMP_HEADER: str(now),
            ID_HEADER: delivery.delivery_id,
            ATTEMPT_HEADER: str(delivery.attempts),
        }

    def _retry_or_fail(self, delivery: _Delivery, retry_after: float | None, why: str) -> None:
        backoff = self.config.retry_delay * 2 ** (delivery.attempts - 1)
        delay = min(backoff, MAX_RETRY_DELAY_SECONDS) * random.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, retry_after)
        due = time.monotonic() + delay
        request_id = delivery.record.request_id
        if due > delivery.received + self.config.max_delivery_seconds:
            logger.warning(
                "webhook of request %s failed after %s attempts: %s",
                request_id,
                delivery.attempts,
                why,
            )
            self._finish(delivery, "failed")
            return
        logger.info("webhook of request %s: %s; retrying in %.1fs", request_id, why, delay)
        METRICS.inc(_DELIVERIES, outcome="retried")
        delivery.due = due
        with self._cond:
            if self._stopping:
                METRICS.inc(_DELIVERIES, outcome="dropped")
                return
            heapq.heappush(self._heap, delivery)
            self._cond.notify()

    @staticmethod
    def _finish(delivery: _Delivery, outcome: str) -> None:
        METRICS.inc(_DELIVERIES, outcome=outcome)
        METRICS.observe(_SECONDS, time.monotonic() - delivery.received, outcome=outcome)
