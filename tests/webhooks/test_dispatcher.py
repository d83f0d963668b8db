"""The dispatcher on real sockets: retries, give-ups, the time bound, the backlog, the re-check
at delivery, and TLS to a pinned address."""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import json
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agentkernel.core.config.webhooks import WebhooksConfig
from agentkernel.pipeline.runtime.metrics import METRICS
from agentkernel.pipeline.webhooks.delivery import WebhookDispatcher
from agentkernel.pipeline.webhooks.sender import Timeouts, post
from agentkernel.pipeline.webhooks.urls import Target
from agentkernel.pipeline.wire.records import ResponseRecord
from agentkernel.webhooks import ATTEMPT_HEADER, ID_HEADER, SIGNATURE_HEADER, verify_signature
from tests.webhooks.receiver import Receiver

SECRET = "dispatch-secret"


def dev(**extra: Any) -> WebhooksConfig:
    settings: dict[str, Any] = {
        "secret": SECRET,
        "allowed_hosts": ["127.0.0.1"],
        "allow_http_loopback": True,
        "retry_delay": 0.1,
        "max_delivery_seconds": 5.0,
        "connect_timeout": 1.0,
        "read_timeout": 2.0,
    }
    return WebhooksConfig(**(settings | extra))


def count(outcome: str) -> float:
    for line in METRICS.render().splitlines():
        if line.startswith(f'agentkernel_webhook_deliveries_total{{outcome="{outcome}"}}'):
            return float(line.split()[-1])
    return 0.0


RECORD = ResponseRecord("req-1", "sess-1", 200, {"result": "done ✓", "request_id": "req-1"})


@pytest.fixture
def receivers() -> Iterator[list[Receiver]]:
    METRICS.reset()
    made: list[Receiver] = []
    yield made
    for receiver in made:
        receiver.close()


@pytest.fixture
def dispatchers() -> Iterator[list[WebhookDispatcher]]:
    made: list[WebhookDispatcher] = []
    yield made
    for dispatcher in made:
        dispatcher.close(0)


def start(receivers: list[Receiver], statuses: list[int]) -> Receiver:
    receiver = Receiver(statuses)
    receivers.append(receiver)
    return receiver


def dispatcher(made: list[WebhookDispatcher], config: WebhooksConfig) -> WebhookDispatcher:
    made.append(WebhookDispatcher(config))
    return made[-1]


def test_a_500_is_retried_with_backoff_then_delivered(
    receivers: list[Receiver], dispatchers: list[WebhookDispatcher]
) -> None:
    receiver = start(receivers, [500, 503, 200])
    sender = dispatcher(dispatchers, dev())
    began = time.monotonic()
    assert sender.submit(receiver.url, RECORD)
    assert time.monotonic() - began < 0.05  # queued, not sent, on the caller's thread
    posts = receiver.wait(3)
    assert sender.drain(5)
    gaps = [b.at - a.at for a, b in itertools.pairwise(posts)]
    assert 0.05 <= gaps[0] < 1.0 and 0.1 <= gaps[1] < 1.5, gaps  # 0.1 s, then 0.2 s, jittered
    assert [p.headers[ATTEMPT_HEADER] for p in posts] == ["1", "2", "3"]
    assert len({p.headers[ID_HEADER] for p in posts}) == 1
    for p in posts:
        verify_signature(p.body, p.headers[SIGNATURE_HEADER], SECRET)
    assert json.loads(posts[0].body) == {
        "type": "turn.finished",
        "request_id": "req-1",
        "session_id": "sess-1",
        "status_code": 200,
        "body": {"result": "done ✓", "request_id": "req-1"},
    }
    assert (count("retried"), count("delivered"), count("failed")) == (2, 1, 0)
    assert "agentkernel_webhook_delivery_seconds_count" in METRICS.render()


@pytest.mark.parametrize("status", [400, 404, 410, 301])
def test_other_answers_end_the_delivery_at_once(
    receivers: list[Receiver], dispatchers: list[WebhookDispatcher], status: int
) -> None:
    receiver = start(receivers, [status, 200])
    sender = dispatcher(dispatchers, dev())
    sender.submit(receiver.url, RECORD)
    receiver.wait(1)
    assert sender.drain(5)
    time.sleep(0.3)  # a retry would have come after 0.05-0.1 s
    assert len(receiver.received) == 1
    assert (count("failed"), count("retried"), count("delivered")) == (1, 0, 0)


def test_429_is_retried_and_retry_after_is_honoured(
    receivers: list[Receiver], dispatchers: list[WebhookDispatcher]
) -> None:
    hits: list[float] = []

    class Busy(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            hits.append(time.monotonic())
            self.send_response(429 if len(hits) == 1 else 204)
            self.send_header("Retry-After", "1")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sender = dispatcher(dispatchers, dev())
        sender.submit(f"http://127.0.0.1:{server.server_address[1]}/", RECORD)
        assert sender.drain(5)
        assert len(hits) == 2 and 0.95 <= hits[1] - hits[0] < 2.0
        assert (count("retried"), count("delivered")) == (1, 1)
    finally:
        server.shutdown()
        server.server_close()


def test_retries_stop_at_max_delivery_seconds(
    receivers: list[Receiver], dispatchers: list[WebhookDispatcher]
) -> None:
    receiver = start(receivers, [503])
    sender = dispatcher(dispatchers, dev(max_delivery_seconds=0.6))
    began = time.monotonic()
    sender.submit(receiver.url, RECORD)
    assert sender.drain(5)
    posts = receiver.wait(2)
    assert posts[-1].at - began <= 0.6 + 0.2  # no attempt starts after the bound
    time.sleep(0.3)
    assert len(receiver.received) == len(posts)
    assert count("failed") == 1 and count("retried") == len(posts) - 1


def test_a_connection_refused_is_retried(dispatchers: list[WebhookDispatcher]) -> None:
    METRICS.reset()
    receiver = Receiver([200])
    url = receiver.url
    receiver.close()  # nothing listens there now
    sender = dispatcher(dispatchers, dev(max_delivery_seconds=0.4))
    sender.submit(url, RECORD)
    assert sender.drain(5)
    assert count("retried") >= 1 and count("failed") == 1


def test_the_url_is_checked_again_at_delivery(
    receivers: list[Receiver], dispatchers: list[WebhookDispatcher]
) -> None:
    """A process whose own settings refuse the URL sends nothing (here: no loopback switch)."""
    receiver = start(receivers, [200])
    sender = dispatcher(dispatchers, dev(allow_http_loopback=False))
    sender.submit(receiver.url, RECORD)
    assert sender.drain(5)
    time.sleep(0.1)
    assert receiver.received == [] and count("failed") == 1


def test_without_a_secret_nothing_is_sent(
    receivers: list[Receiver], dispatchers: list[WebhookDispatcher]
) -> None:
    receiver = start(receivers, [200])
    sender = dispatcher(dispatchers, dev(secret=None))
    assert not sender.submit(receiver.url, RECORD)
    time.sleep(0.1)
    assert receiver.received == [] and count("failed") == 1


def test_a_full_backlog_drops_and_counts(
    receivers: list[Receiver], dispatchers: list[WebhookDispatcher], caplog: Any
) -> None:
    receiver = start(receivers, [500])
    sender = dispatcher(dispatchers, dev(max_pending=2, retry_delay=30, max_delivery_seconds=60))
    for n in range(2):
        assert sender.submit(receiver.url, ResponseRecord(f"r{n}", "s", 200, {}))
    receiver.wait(2)  # both tried once, now waiting 15-30 s for their retry
    began = time.monotonic()
    for n in range(2, 6):
        assert not sender.submit(receiver.url, ResponseRecord(f"r{n}", "s", 200, {}))
    assert time.monotonic() - began < 0.05
    assert count("dropped") == 4
    assert sum("dropped" in r.getMessage() for r in caplog.records) == 1  # logged once
    began = time.monotonic()
    sender.close(0.2)  # the two waiting ones are given up
    assert time.monotonic() - began < 1.0
    assert count("dropped") == 6 and sender.pending() == 0


# -- TLS to a pinned address ---------------------------------------------------------------------


def _certificate(tmp: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_https_goes_to_the_checked_address_and_verifies_the_url_host(tmp_path: Path) -> None:
    """The connection is made to the address given (no second lookup of the name, which does
    not even resolve here), while TLS checks the certificate against the URL's host."""
    cert, key = _certificate(tmp_path, "hooks.test")
    receiver = Receiver([200])
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(cert, key)
    receiver.server.socket = served.wrap_socket(receiver.server.socket, server_side=True)
    trusted = ssl.create_default_context(cafile=str(cert))
    port = receiver.server.server_address[1]
    loopback = [ipaddress.ip_address("127.0.0.1")]
    timeouts = Timeouts(1.0, 2.0)
    try:
        target = Target("https", "hooks.test", port, "/hook")
        answer = post(
            target, loopback, b"{}", {"Content-Type": "application/json"}, timeouts, trusted
        )
        assert answer.status == 200
        assert receiver.wait(1)[0].headers["Host"] == f"hooks.test:{port}"
        with pytest.raises(ssl.SSLCertVerificationError):
            post(Target("https", "other.test", port, "/"), loopback, b"{}", {}, timeouts, trusted)
    finally:
        receiver.close()
