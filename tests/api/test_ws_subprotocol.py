"""A credential offered in the ``/ws`` handshake as a subprotocol (what a browser can send).

Against a real uvicorn server with API keys and JWTs on: the credential is checked as the header
it stands for, the answer selects only ``agentkernel.v1``, hostile handshakes get a 401 that
says what was wrong, and no log line (access log, the server's own lines at DEBUG) holds it.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import websockets.sync.client as ws_client
from pydantic import SecretStr
from websockets.exceptions import InvalidStatus

from agentkernel.pipeline.http import subprotocols
from agentkernel.pipeline.http.subprotocols import PROTOCOL, SubprotocolError, encode

from .conftest import Server
from .test_docs_snippets import snippet

test_auth = pytest.importorskip("tests.api.test_auth", reason="JWT support needs the 'auth' extra")
KEYS, SECRET, start, token = test_auth.KEYS, test_auth.SECRET, test_auth.start, test_auth.token
AUTH = {
    "enabled": True,
    "api_keys": [{"user": u, "key": k} for u, k in KEYS.items()],
    "jwt": {"secret": SECRET, "audience": "agents", "issuer": "https://issuer.test"},
}


@pytest.fixture(autouse=True)
def _server_logs_reach_caplog() -> Iterator[None]:
    """These tests read the server's DEBUG lines; an earlier test of the run may have configured
    its loggers (a level, no propagation, disabled by a logging config): undo that here."""
    saved = []
    for name in ("uvicorn", "uvicorn.error"):
        log = logging.getLogger(name)
        saved.append((log, log.level, log.propagate, log.disabled))
        log.setLevel(logging.NOTSET)
        log.propagate, log.disabled = True, False
    yield
    for log, level, propagate, disabled in saved:
        log.setLevel(level)
        log.propagate, log.disabled = propagate, disabled


@pytest.fixture
def server() -> Iterator[Server]:
    s = start(AUTH, idempotency_secret=SecretStr("server-side-secret"), access_log=True)
    yield s
    s.close()


def ws_url(server: Server, query: str = "") -> str:
    return server.url.replace("http://", "ws://") + "/ws" + query


def turn(ws: Any, session: str, prompt: str) -> list[str]:
    """Run one turn of the test's ``echo`` agent; the prompts the session has seen."""
    ws.send(json.dumps({"session_id": session, "prompt": prompt}))
    frames = [json.loads(ws.recv(timeout=10)) for _ in range(2)]
    assert [f["type"] for f in frames] == ["CHAT_QUEUED", "CHAT_RESPONSE"], frames
    return list(json.loads(frames[1]["result"]))


def refusal(server: Server, offered: list[str], **more: Any) -> dict[str, Any]:
    """The 401 document a handshake offering ``offered`` is answered with."""
    with pytest.raises(InvalidStatus) as refused:
        ws_client.connect(more.pop("uri", ws_url(server)), subprotocols=offered or None, **more)
    response = refused.value.response
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert "Sec-WebSocket-Protocol" not in response.headers
    return dict(json.loads(response.body))


# ---- the codec -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "secret",
    ["alice-key-7f3a", "a", "ab", "abc", 'k=e/y+,; "é€', "x" * 3000, "eyJh.eyJz.c2ln"],
)
@pytest.mark.parametrize("kind", ["key", "bearer"])
def test_every_credential_round_trips_as_one_header_token(kind: Any, secret: str) -> None:
    protocol = encode(kind, secret)
    assert protocol.startswith(f"agentkernel.auth.{kind}.")
    assert all(c.isalnum() or c in "._-" for c in protocol), protocol  # an RFC 6455 token
    offered = subprotocols.credential_of([PROTOCOL, protocol])
    assert offered is not None and (offered.kind, offered.secret) == (kind, secret)
    if len(secret) > 3:
        assert secret not in repr(offered)


def test_the_subprotocols_of_several_headers_are_read_in_order() -> None:
    headers = [
        (b"Sec-WebSocket-Protocol", b"agentkernel.v1, other"),
        (b"host", b"x"),
        (b"sec-websocket-protocol", b" third ,"),
    ]
    assert subprotocols.offered(headers) == ["agentkernel.v1", "other", "third"]
    assert subprotocols.selected(["other", PROTOCOL]) == PROTOCOL
    assert subprotocols.selected(["other", encode("key", "k")]) is None
    assert subprotocols.credential_of(["agentkernel.v1", "other"]) is None


@pytest.mark.parametrize(
    "text",
    ["", "YWxpY2U=", "YWxpY2", "Y", "YWxpY2V", "YW+pY2U", "YW/pY2U", "YW.pY2U", "_w", "YQo"],
    ids=[
        "empty",
        "padded",
        "cut",
        "one-char",
        "stray-bits",
        "plus",
        "slash",
        "dot",
        "not-utf8",
        "control",
    ],
)
def test_only_canonical_base64url_of_a_credential_is_read(text: str) -> None:
    with pytest.raises(SubprotocolError, match="not base64url"):
        subprotocols.credential_of([PROTOCOL, f"agentkernel.auth.key.{text}"])


# ---- the handshake ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["key", "bearer"])
def test_a_subprotocol_credential_opens_the_socket_as_its_identity(
    server: Server, kind: Any
) -> None:
    secret = KEYS["alice"] if kind == "key" else token("alice")
    session = f"sub-{kind}"
    with ws_client.connect(ws_url(server), subprotocols=[PROTOCOL, encode(kind, secret)]) as ws:
        assert ws.subprotocol == PROTOCOL
        assert ws.response.headers.get_all("Sec-WebSocket-Protocol") == [PROTOCOL]
        assert turn(ws, session, "one") == ["one"]
    # the same identity over HTTP, with the header the subprotocol stood for
    header = {"X-API-Key": secret} if kind == "key" else {"Authorization": f"Bearer {secret}"}
    again = server.client.post(
        "/api/v1/chat", json={"session_id": session, "prompt": "two"}, headers=header
    )
    assert json.loads(again.json()["result"]) == ["one", "two"]
    bob = server.client.post(  # bob's session of that name is his own
        "/api/v1/chat",
        json={"session_id": session, "prompt": "x"},
        headers={"X-API-Key": KEYS["bob"]},
    )
    assert json.loads(bob.json()["result"]) == ["x"]


def test_the_kind_decides_how_the_credential_is_checked(server: Server) -> None:
    """A key offered as a bearer token is read as a JWT, and a token offered as a key is not
    a configured key: the two never stand in for each other."""
    assert refusal(server, [PROTOCOL, encode("bearer", KEYS["alice"])])["message"] == (
        "the token is not a well-formed JWT"
    )
    assert refusal(server, [PROTOCOL, encode("key", token("alice"))])["message"] == (
        "unknown API key"
    )


def test_without_a_credential_agentkernel_v1_alone_is_refused_as_missing(server: Server) -> None:
    with pytest.raises(InvalidStatus) as refused:
        ws_client.connect(ws_url(server), subprotocols=[PROTOCOL])
    response = refused.value.response
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="agentkernel"'
    assert json.loads(response.body)["message"] == "a bearer token or an API key is required"


HOSTILE = {
    "malformed": ([PROTOCOL, "agentkernel.auth.key.YWxpY2V"], "is not base64url"),
    "oversized": (
        [PROTOCOL, encode("bearer", "x" * 5000)],
        "Sec-WebSocket-Protocol is over 6144 bytes",
    ),
    "two-credentials": (
        [PROTOCOL, encode("key", KEYS["alice"]), encode("key", KEYS["bob"])],
        "more than one credential subprotocol",
    ),
    "the-same-one-twice": (
        [PROTOCOL, encode("key", KEYS["alice"]), encode("key", KEYS["alice"])],
        "more than one credential subprotocol",
    ),
    "unknown-kind": ([PROTOCOL, "agentkernel.auth.basic.YWxpY2U"], "kind is not one of"),
    "no-agentkernel-v1": ([encode("key", KEYS["alice"])], "needs agentkernel.v1 offered"),
}


@pytest.mark.parametrize(("offered", "said"), list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_subprotocol_is_refused_with_a_reason(
    server: Server, offered: list[str], said: str
) -> None:
    doc = refusal(server, offered)
    assert doc["error"] == "UNAUTHORIZED" and said in doc["message"], doc
    for secret in KEYS.values():
        assert secret not in doc["message"]


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        ([("Sec-WebSocket-Protocol", f"{PROTOCOL}, agentkernel.auth.key.YWxpY2V")], "base64url"),
        (
            [
                ("Sec-WebSocket-Protocol", PROTOCOL),
                ("Sec-WebSocket-Protocol", encode("key", KEYS["alice"])),
                ("Sec-WebSocket-Protocol", encode("key", KEYS["bob"])),
            ],
            "more than one credential",
        ),
        (
            [
                ("Sec-WebSocket-Protocol", f"{PROTOCOL}, {'a' * 4000}"),
                ("Sec-WebSocket-Protocol", "b" * 3000),
            ],
            "over 6144 bytes",
        ),
    ],
    ids=["stray-bits", "across-headers", "oversized-across-headers"],
)
def test_raw_headers_a_browser_would_not_send_are_refused(
    server: Server, headers: list[tuple[str, str]], said: str
) -> None:
    """What a hand-made client can send: every ``Sec-WebSocket-Protocol`` header is read."""
    doc = refusal(server, [], additional_headers=headers)
    assert said in doc["message"], doc


@pytest.mark.parametrize(
    "value", ["c2VjcmV0LWtleQ=", "secret-one secret-two"], ids=["padded", "space"]
)
def test_a_subprotocol_that_is_no_header_token_is_refused_before_the_app_unlogged(
    server: Server,
    value: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The WebSocket library answers 400 itself, and at DEBUG logs a traceback quoting the
    header: the credential is masked there too."""
    monkeypatch.setattr(logging.getLogger("uvicorn.error"), "propagate", True)
    header = [("Sec-WebSocket-Protocol", f"{PROTOCOL}, agentkernel.auth.key.{value}")]
    with caplog.at_level(logging.DEBUG), pytest.raises(InvalidStatus) as refused:
        ws_client.connect(ws_url(server), additional_headers=header)
    assert refused.value.response.status_code == 400
    time.sleep(0.2)
    server_side = [r for r in caplog.records if r.name == "uvicorn.error"]
    traceback = [r for r in server_side if r.getMessage() == "! invalid handshake"]
    assert (
        traceback and traceback[0].exc_text and "agentkernel.auth.key.***" in traceback[0].exc_text
    )
    formatter = logging.Formatter()
    text = "\n".join(formatter.format(r) for r in server_side)
    assert not any(part in text for part in value.split()), text


@pytest.mark.parametrize(
    "other",
    [
        {"additional_headers": {"Authorization": "Bearer {token}"}},
        {"additional_headers": {"X-API-Key": KEYS["bob"]}},
        {"additional_headers": {"Authorization": "Basic YWxpY2U6cHc="}},
        {"query": "?token={token}"},
    ],
    ids=["authorization", "x-api-key", "basic", "query-token"],
)
def test_a_subprotocol_credential_and_another_that_disagree_are_refused(
    server: Server, other: dict[str, Any]
) -> None:
    """Each of the other credentials would be accepted on its own (Basic aside): which one the
    server should believe is not guessed."""
    carol = token("carol")
    more: dict[str, Any] = {}
    if "additional_headers" in other:
        headers = other["additional_headers"]
        more["additional_headers"] = {k: v.format(token=carol) for k, v in headers.items()}
    else:
        more["uri"] = ws_url(server, other["query"].format(token=carol))
    doc = refusal(server, [PROTOCOL, encode("key", KEYS["alice"])], **more)
    assert "are not the same credential" in doc["message"], doc


def test_a_subprotocol_credential_and_the_same_header_are_one_credential(server: Server) -> None:
    alice = token("alice")
    offered = [PROTOCOL, encode("bearer", alice)]
    with ws_client.connect(
        ws_url(server, "?token=" + alice),
        subprotocols=offered,
        additional_headers={"Authorization": f"Bearer {alice}"},
    ) as ws:
        assert ws.subprotocol == PROTOCOL
        assert turn(ws, "same", "hi") == ["hi"]


def test_a_subprotocol_credential_never_reaches_a_log_line(
    server: Server, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not the access log, not a refusal, and not the handshake headers the WebSocket library
    logs on uvicorn's logger at DEBUG (which would name ``Sec-WebSocket-Protocol`` whole)."""
    monkeypatch.setattr(logging.getLogger("uvicorn"), "propagate", True)
    monkeypatch.setattr(logging.getLogger("uvicorn.error"), "propagate", True)
    good, bad = token("erin"), token("erin", key="another-secret-of-enough-length-0123456789")
    secrets = [good, bad, KEYS["alice"], "wrong-key-0d1e"]
    with caplog.at_level(logging.DEBUG):
        for kind, secret in (("bearer", good), ("key", KEYS["alice"])):
            with ws_client.connect(ws_url(server), subprotocols=[PROTOCOL, encode(kind, secret)]):
                pass
        refusal(server, [PROTOCOL, encode("bearer", bad)])
        refusal(server, [PROTOCOL, encode("key", "wrong-key-0d1e")])
        refusal(  # a header the subprotocol disagrees with is masked too
            server, [PROTOCOL, encode("key", KEYS["alice"])], additional_headers={"X-API-Key": bad}
        )
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (
            sum('"WS /ws"' in r.getMessage() for r in caplog.records) < 5
        ):
            time.sleep(0.05)
    # every line but the test client's own (websockets.client logs what it sends)
    messages = [r.getMessage() for r in caplog.records if r.name != "websockets.client"]
    debug = [m for m in messages if m.lower().startswith("< sec-websocket-protocol")]
    assert any("agentkernel.auth.bearer.***" in m for m in debug), debug  # the filter ran
    access = [m for m in messages if '"WS /ws"' in m]
    assert sum('"WS /ws" 101 ' in m and "user=erin" in m for m in access) == 1, access
    assert sum('"WS /ws" 401 ' in m for m in access) == 3, access
    for secret in secrets:
        for text in (secret, encode("key", secret).rsplit(".", 1)[1]):
            assert not any(text in m for m in messages), text


def test_the_documented_client_runs_as_written(server: Server) -> None:
    code = snippet("authentication.md", "ws-subprotocol")
    code = code.replace("ws://127.0.0.1:8000", ws_url(server).removesuffix("/ws"))
    code = code.replace('"my-api-key"', repr(KEYS["alice"]))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "authentication.md", "exec"), {})
    assert out.getvalue().splitlines() == [PROTOCOL, '["hi"]']
