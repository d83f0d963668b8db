"""Authentication and session ownership against a real uvicorn server (api.auth)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets.sync.client as ws_client
from pydantic import SecretStr
from websockets.exceptions import InvalidStatus

from agentkernel import Agent, AgentRegistry
from agentkernel.core.config.auth import AuthConfig
from agentkernel.pipeline.http import subprotocols
from agentkernel.pipeline.process.io_handler import IOHandler

from .conftest import Server, make_config, poll

jwt = pytest.importorskip("jwt", reason="JWT support needs the 'auth' extra")

SECRET = "hs256-test-secret-of-enough-length-0123456789"
KEYS = {"alice": "alice-key-7f3a", "bob": "bob-key-91c2"}


def echo(turn):  # type: ignore[no-untyped-def]
    time.sleep(float(turn.extra.get("delay", 0)))
    turn.state.setdefault("seen", []).append(turn.prompt)
    return json.dumps(turn.state["seen"])


def start(auth: dict[str, Any], **api: Any) -> Server:
    registry = AgentRegistry()
    registry.register(Agent("echo", echo))
    config = make_config(auth=AuthConfig.model_validate(auth), **api)
    return Server(IOHandler(config, registry=registry, with_runner=True))


@pytest.fixture
def server() -> Iterator[Server]:
    auth = {
        "enabled": True,
        "api_keys": [{"user": u, "key": k} for u, k in KEYS.items()],
        "jwt": {"secret": SECRET, "audience": "agents", "issuer": "https://issuer.test"},
    }
    s = start(auth, idempotency_secret=SecretStr("server-side-secret"))
    yield s
    s.close()


def token(user: str = "carol", key: Any = SECRET, algorithm: str = "HS256", **claims: Any) -> str:
    body = {"sub": user, "aud": "agents", "iss": "https://issuer.test", "exp": time.time() + 60}
    body |= claims
    return jwt.encode({k: v for k, v in body.items() if v is not None}, key, algorithm=algorithm)


def as_key(user: str) -> dict[str, str]:
    return {"X-API-Key": KEYS[user]}


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


def chat(server: Server, session: str, prompt: str, headers: dict[str, str]) -> httpx.Response:
    body = {"session_id": session, "prompt": prompt}
    return server.client.post("/api/v1/chat", json=body, headers=headers)


def test_health_and_ready_stay_open(server: Server) -> None:
    assert server.client.get("/health").status_code == 200
    assert server.client.get("/ready").status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"X-API-Key": "not-a-key"},
        bearer(token(exp=time.time() - 120)),  # expired
        bearer(token(aud="someone-else")),  # wrong audience
        bearer(token(iss="https://evil.test")),  # wrong issuer
        bearer(token(key="another-secret-of-enough-length-0123456789")),  # wrong key
        bearer(token(exp=None)),  # no expiry at all
        bearer("garbage.token.value"),
        {"Authorization": "Basic YWxpY2U6cHc="},
    ],
    ids=[
        "missing",
        "bad-key",
        "expired",
        "audience",
        "issuer",
        "signature",
        "no-exp",
        "garbage",
        "basic",
    ],
)
def test_every_route_refuses_bad_credentials(server: Server, headers: dict[str, str]) -> None:
    for method, path in (
        ("POST", "/api/v1/chat"),
        ("GET", "/api/v1/chat/s?request_id=x"),
        ("GET", "/api/v1/agents"),
        ("GET", "/metrics"),
        ("GET", "/api/v1/chat/s/stream?request_id=x"),
    ):
        response = server.client.request(
            method, path, headers=headers, json={"session_id": "s", "prompt": "p"}
        )
        assert response.status_code == 401, (method, path, response.text)
        assert response.json()["error"] == "UNAUTHORIZED"
        assert response.headers["www-authenticate"].startswith("Bearer")


def test_api_keys_and_tokens_are_accepted(server: Server) -> None:
    assert chat(server, "k1", "hi", as_key("alice")).status_code == 200
    assert chat(server, "j1", "hi", bearer(token("carol"))).status_code == 200


def test_a_session_belongs_to_the_identity_that_created_it(server: Server) -> None:
    mine = chat(server, "owned", "one", as_key("alice"))
    assert mine.status_code == 200
    request_id = mine.json()["request_id"]
    # bob's "owned" is bob's own session: it neither sees nor touches alice's
    theirs = chat(server, "owned", "intrude", as_key("bob"))
    assert (theirs.status_code, json.loads(theirs.json()["result"])) == (200, ["intrude"])
    peek = server.client.get(
        "/api/v1/chat/owned", params={"request_id": request_id}, headers=as_key("bob")
    )
    assert peek.status_code == 404
    with httpx.Client(base_url=server.url, headers=as_key("alice")) as alice:
        assert poll(alice, "owned", request_id).status_code == 200
    again = chat(server, "owned", "two", as_key("alice"))
    assert json.loads(again.json()["result"]) == ["one", "two"]  # bob's turn never ran


def test_a_running_turn_is_pending_only_for_its_owner(server: Server) -> None:
    accepted = server.client.post(
        "/api/v1/chat",
        json={"session_id": "slow-owned", "prompt": "p", "delay": 0.6},
        headers=as_key("alice") | {"Prefer": "respond-async"},
    )
    params = {"request_id": accepted.json()["request_id"]}
    own = server.client.get("/api/v1/chat/slow-owned", params=params, headers=as_key("alice"))
    other = server.client.get("/api/v1/chat/slow-owned", params=params, headers=as_key("bob"))
    assert (own.status_code, own.json()["error"]) == (404, "PENDING")
    assert (other.status_code, other.json()["error"]) == (404, "NOT_FOUND")


def test_idempotent_request_ids_are_per_identity_and_keyed(server: Server) -> None:
    key = {"Idempotency-Key": "same-key", "Prefer": "respond-async"}
    alice = chat(server, "idem", "x", as_key("alice") | key).json()["request_id"]
    bob = chat(server, "idem-b", "x", as_key("bob") | key).json()["request_id"]
    assert alice != bob
    assert (
        alice != uuid.uuid5(uuid.UUID("6f1c3a4e-8f7d-4c1b-9a55-2f3e0b7c9d10"), "idem\nsame-key").hex
    )


def test_websocket_handshake_needs_a_credential(server: Server) -> None:
    url = server.url.replace("http://", "ws://") + "/ws"
    for bad in ("", "?token=" + token(exp=time.time() - 100)):
        with pytest.raises(InvalidStatus) as refused:
            ws_client.connect(url + bad).close()
        assert refused.value.response.status_code == 401
        assert refused.value.response.headers["WWW-Authenticate"].startswith("Bearer")
        assert json.loads(refused.value.response.body)["error"] == "UNAUTHORIZED"
    with ws_client.connect(url + "?token=" + token("dave")) as ws:
        ws.send(json.dumps({"session_id": "w", "prompt": "hi"}))
        frames = [json.loads(ws.recv(timeout=10)) for _ in range(2)]
    assert [f["type"] for f in frames] == ["CHAT_QUEUED", "CHAT_RESPONSE"]


def test_secrets_never_reach_the_logs(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    bad = token(key="another-secret-of-enough-length-0123456789")
    with caplog.at_level(logging.DEBUG):
        chat(server, "log", "x", bearer(bad))
        chat(server, "log", "x", {"X-API-Key": "wrong-key-123"})
        chat(server, "log", "x", as_key("alice"))
    text = "\n".join(r.getMessage() for r in caplog.records)
    for secret in (bad, "wrong-key-123", KEYS["alice"], SECRET):
        assert secret not in text


def keypair(kind: str) -> tuple[Any, bytes]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    private = (
        rsa.generate_private_key(65537, 2048)
        if kind == "RS256"
        else ec.generate_private_key(ec.SECP256R1())
    )
    public = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


def test_rs256_public_key_and_es256_jwks(tmp_path: Path) -> None:
    rsa_key, rsa_public = keypair("RS256")
    (tmp_path / "rsa.pem").write_bytes(rsa_public)
    by_file = start(
        {
            "enabled": True,
            "jwt": {"algorithms": ["RS256"], "public_key_file": str(tmp_path / "rsa.pem")},
        }
    )
    try:
        good = token("erin", rsa_key, "RS256", aud=None, iss=None)
        assert chat(by_file, "r", "hi", bearer(good)).status_code == 200
        forged = token("erin", keypair("RS256")[0], "RS256", aud=None, iss=None)
        assert chat(by_file, "r", "hi", bearer(forged)).status_code == 401
    finally:
        by_file.close()
    ec_key, _ = keypair("ES256")
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key()))
    (tmp_path / "jwks.json").write_text(
        json.dumps({"keys": [jwk | {"kid": "k1", "alg": "ES256", "use": "sig"}]})
    )
    by_jwks = start(
        {
            "enabled": True,
            "jwt": {"algorithms": ["ES256"], "jwks_file": str(tmp_path / "jwks.json")},
        }
    )
    try:
        signed = jwt.encode(
            {"sub": "fay", "exp": time.time() + 60}, ec_key, "ES256", headers={"kid": "k1"}
        )
        assert chat(by_jwks, "e", "hi", bearer(signed)).status_code == 200
        unknown_kid = jwt.encode(
            {"sub": "fay", "exp": time.time() + 60}, ec_key, "ES256", headers={"kid": "k9"}
        )
        assert chat(by_jwks, "e", "hi", bearer(unknown_kid)).status_code == 401
    finally:
        by_jwks.close()


def test_access_log_lines_name_the_turn_and_user_and_never_a_credential(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = start({"enabled": True, "jwt": {"secret": SECRET}}, access_log=True)
    secret_token = token("erin")
    try:
        with caplog.at_level(logging.INFO, logger="agentkernel.access"):
            answered = chat(s, "logged", "hi", bearer(secret_token))
            refused = chat(s, "logged", "hi", bearer("not-a-token"))
            url = s.url.replace("http://", "ws://") + "/ws?token=" + secret_token
            with ws_client.connect(url) as ws:
                ws.send(json.dumps({"session_id": "w", "prompt": "hi"}))
                ws.recv(timeout=10)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not any(
                '"WS /ws' in r.getMessage() for r in caplog.records
            ):
                time.sleep(0.05)
    finally:
        s.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "agentkernel.access"]
    request_id = answered.json()["request_id"]
    assert refused.status_code == 401
    assert any(
        '"POST /api/v1/chat" 200 ' in line
        and f"request_id={request_id}" in line
        and "user=erin" in line
        for line in lines
    ), lines
    assert any('"POST /api/v1/chat" 401 ' in line for line in lines), lines
    assert any('"WS /ws?token=***" 101 ' in line and "user=erin" in line for line in lines), lines
    assert not any(secret_token in line or "not-a-token" in line for line in lines)


def test_query_tokens_only_open_the_websocket_handshake(server: Server) -> None:
    response = server.client.get("/api/v1/agents", params={"token": token("carol")})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == 'Bearer realm="agentkernel"'  # none was sent
    refused = server.client.get("/api/v1/agents", headers=bearer("garbage"))
    assert 'error="invalid_token"' in refused.headers["www-authenticate"]


def test_a_user_id_with_control_characters_is_refused(server: Server) -> None:
    forged = token("eve\n2026-11-30 00:00:00 INFO agentkernel.auth: FORGED")
    assert chat(server, "f", "hi", bearer(forged)).status_code == 401


def test_server_log_lines_mask_tokens_and_escape_forged_lines(
    server: Server, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # uvicorn's own dictConfig (applied by any uvicorn.run in this process, e.g. a fake model
    # server) stops its loggers from propagating; undo that so its lines are captured here.
    monkeypatch.setattr(logging.getLogger("uvicorn"), "propagate", True)
    monkeypatch.setattr(logging.getLogger("uvicorn.error"), "propagate", True)
    secret_token = token("dave")
    with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, logger="uvicorn.error"):
        with ws_client.connect(
            server.url.replace("http://", "ws://") + "/ws?token=" + secret_token
        ) as ws:
            ws.send(json.dumps({"session_id": "w", "prompt": "hi"}))
            ws.recv(timeout=10)
        server.client.get("/zz%0A2026-11-30 00:00:00,000 INFO MainThread x: FORGED")
        time.sleep(0.2)
    messages = [r.getMessage() for r in caplog.records]
    assert any("/ws?token=***" in m for m in messages), messages  # uvicorn's own line
    assert not any(secret_token in m for m in messages)
    assert not any("\n" in m and "FORGED" in m for m in messages)
    assert any("\\n2026-11-30" in m for m in messages)


def test_the_chat_command_sends_an_api_key_or_a_token(server: Server) -> None:
    command = [sys.executable, "-m", "agentkernel", "chat", "--url", server.url, "--session"]
    with_key = subprocess.run(
        [*command, "cli-key", "--api-key", KEYS["alice"], "hi"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (with_key.returncode, with_key.stdout) == (0, '["hi"]\n'), with_key.stderr
    with_token = subprocess.run(
        [*command, "cli-token", "hello"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "AGENTKERNEL_TOKEN": token("carol")},
    )
    assert (with_token.returncode, with_token.stdout) == (0, '["hello"]\n'), with_token.stderr
    without = subprocess.run(
        [*command, "cli-none", "x"], capture_output=True, text=True, timeout=60
    )
    assert without.returncode == 1 and "HTTP 401" in without.stderr


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: None, "a bearer token or an API key is required"),
        (lambda: {"X-API-Key": "nobody-key"}, "unknown API key"),
        (lambda: bearer("not-a-jwt"), "the token is not a well-formed JWT"),
        (lambda: bearer(token(exp=time.time() - 600)), "the token has expired"),
        (
            lambda: bearer(token(aud="elsewhere")),
            "the token's audience (aud) is not the configured one",
        ),
        (
            lambda: bearer(token(iss="https://other.test")),
            "the token's issuer (iss) is not the configured one",
        ),
        (lambda: bearer(token(exp=None)), "the token has no 'exp' claim"),
        (
            lambda: bearer(token(key="another-secret-of-enough-length-0123456")),
            "the token's signature does not verify",
        ),
        (
            lambda: bearer(token(nbf=time.time() + 600)),
            "the token is not valid yet (nbf or iat is in the future)",
        ),
        (
            lambda: bearer(token(key=None, algorithm="none")),
            "the token is signed with an algorithm that is not accepted",
        ),
    ],
    ids=[
        "none",
        "unknown-key",
        "malformed",
        "expired",
        "audience",
        "issuer",
        "no-exp",
        "signature",
        "not-yet",
        "alg-none",
    ],
)
def test_a_refusal_says_what_was_wrong(
    server: Server, make: Callable[[], dict[str, str] | None], said: str
) -> None:
    """The caller is told what was wrong with the credential, never an exception's class name.

    Tokens are made when the case runs: made at collection, a token valid for 60 s has expired
    by the time a long run reaches the case."""
    credential = make()
    response = chat(server, "m", "hi", credential or {})
    assert (response.status_code, response.json()) == (
        401,
        {"error": "UNAUTHORIZED", "message": said},
    )
    url = server.url.replace("http://", "ws://") + "/ws"
    given = (credential or {}).get("Authorization", "").removeprefix("Bearer ")
    offered = [subprotocols.PROTOCOL]
    if credential is not None and "X-API-Key" in credential:
        offered.append(subprotocols.encode("key", credential["X-API-Key"]))
    elif given:
        offered.append(subprotocols.encode("bearer", given))
    handshakes: list[dict[str, Any]] = [{"subprotocols": offered}]
    if "X-API-Key" not in (credential or {}):  # the query takes a token, not a key
        handshakes.append({"uri": url + (f"?token={given}" if given else "")})
    for handshake in handshakes:
        with pytest.raises(InvalidStatus) as refused:
            ws_client.connect(**{"uri": url} | handshake)
        assert refused.value.response.status_code == 401  # an HTTP answer, not a closed socket
        assert json.loads(refused.value.response.body)["message"] == said, handshake
