"""The sessions API on a real uvicorn server: list, show and erase, owner-scoped.

Each case runs with sessions and replies in memory, in Redis, in DynamoDB (moto) and in
PostgreSQL (one schema per test), with two identities (API keys) that must never see, nor erase,
each other's sessions.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

# The core CI stage runs tests/api without the optional extras; this file needs all three stores.
for _extra in ("boto3", "redis", "psycopg"):
    pytest.importorskip(_extra)

import boto3  # noqa: E402
import psycopg  # noqa: E402
import redis  # noqa: E402
from psycopg import sql  # noqa: E402

from agentkernel.core.config.auth import AuthConfig  # noqa: E402
from agentkernel.core.config.root import AKConfig  # noqa: E402
from agentkernel.core.config.stores import (  # noqa: E402
    DynamoDBStoreConfig,
    PostgresStoreConfig,
    RedisStoreConfig,
    SessionConfig,
)
from agentkernel.pipeline.process.io_handler import IOHandler  # noqa: E402
from agentkernel.pipeline.response_store import ResponseStore  # noqa: E402
from agentkernel.pipeline.response_store.dynamodb import DynamoDBResponseStore  # noqa: E402
from agentkernel.pipeline.response_store.postgres import PostgresResponseStore  # noqa: E402
from agentkernel.pipeline.response_store.redis import RedisResponseStore  # noqa: E402
from agentkernel.pipeline.session_store import create_session_store  # noqa: E402
from agentkernel.pipeline.turn_control import Stop, StopKind  # noqa: E402
from agentkernel.pipeline.wire.scoping import session_key  # noqa: E402
from tests.api.conftest import Server, make_config, poll, registry  # noqa: E402
from tests.stores.test_response_stores import create_table  # noqa: E402
from tests.stores.test_session_stores import create_session_table  # noqa: E402

KEYS = {"alice": "alice-key-5d1e", "bob": "bob-key-77af"}
SESSIONS = "/api/v1/sessions"


class Deployment:
    """An embedded server whose stores live in memory, Redis, DynamoDB or PostgreSQL, and their
    contents."""

    def __init__(self, request: pytest.FixtureRequest, kind: str, auth: bool = True) -> None:
        self.kind, self.prefix, self.tables = kind, f"sess-{uuid.uuid4().hex[:8]}:", ("", "")
        config = make_config(auth=self._auth() if auth else AuthConfig())
        store: ResponseStore | None = None
        if kind == "redis":
            url = request.getfixturevalue("redis_url")
            self.redis = redis.Redis.from_url(url)
            store = RedisResponseStore(url, prefix=self.prefix)
            session = SessionConfig(
                type="redis", redis=RedisStoreConfig(url=url, prefix=self.prefix)
            )
            config = config.model_copy(update={"session": session})
        elif kind == "dynamodb":
            request.getfixturevalue("aws")
            self.tables = (f"resp-{uuid.uuid4().hex[:8]}", f"sess-{uuid.uuid4().hex[:8]}")
            create_table(self.tables[0], "request_id")
            create_session_table(self.tables[1])
            store = DynamoDBResponseStore(self.tables[0])
            table = DynamoDBStoreConfig(table_name=self.tables[1])
            config = config.model_copy(
                update={"session": SessionConfig(type="dynamodb", dynamodb=table)}
            )
        elif kind == "postgres":
            self.dsn = request.getfixturevalue("postgres_dsn")
            self.schema = f"sess_{uuid.uuid4().hex[:12]}"
            block = PostgresStoreConfig(dsn=self.dsn, db_schema=self.schema, auto_provision=True)
            store = PostgresResponseStore(block)
            session = SessionConfig(type="postgres", postgres=block)
            config = config.model_copy(update={"session": session})
        self.store, self.config = store, config
        self.server = Server(IOHandler(config, registry=registry(), store=store, with_runner=True))

    @staticmethod
    def _auth() -> AuthConfig:
        return AuthConfig(enabled=True, api_keys=[{"user": u, "key": k} for u, k in KEYS.items()])

    def client(self, who: str | None) -> httpx.Client:
        headers = {} if who is None else {"X-API-Key": KEYS[who]}
        return httpx.Client(base_url=self.server.url, headers=headers, timeout=30)

    def stored(self) -> list[str]:
        """Every key (Redis) or item key (DynamoDB) the deployment holds, as text."""
        if self.kind == "redis":
            return [k.decode() for k in self.redis.scan_iter(match=f"{self.prefix}*")]
        if self.kind == "dynamodb":
            dynamodb, found = boto3.client("dynamodb"), []
            for table in self.tables:
                for item in dynamodb.scan(TableName=table)["Items"]:
                    found.append(json.dumps(item))
            return found
        if self.kind == "postgres":
            return self._rows()
        return []

    def _rows(self) -> list[str]:
        """Every row of every table in the schema, as text, prefixed by its table's name."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            tables = conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                [self.schema],
            ).fetchall()
            found = []
            for (table,) in tables:
                name = sql.Identifier(self.schema, str(table))
                query = sql.SQL("SELECT t::text FROM {} AS t").format(name)
                found += [f"{table}: {row[0]}" for row in conn.execute(query)]
            return found

    def open_turns(self, key: str) -> list[str]:
        """Open two turns of the session at ``key`` as a front in another process would, one
        of them started and both asked to stop; their request ids."""
        sessions = create_session_store(self.config.session)
        try:
            signals = sessions.turn_signals()
            assert signals is not None
            queued, running = f"queued-{uuid.uuid4().hex}", f"running-{uuid.uuid4().hex}"
            signals.open(key, queued)
            signals.start(key, running)
            signals.stop(key, queued, Stop(StopKind.CANCEL))
            signals.stop(key, running, Stop(StopKind.INTERRUPT, by=queued))
            return [queued, running]
        finally:
            sessions.close()

    def close(self) -> None:
        self.server.close()
        if self.store is not None:
            self.store.close()
        if self.kind == "postgres":
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(self.schema)))


STORES = [
    "memory",
    "redis",
    pytest.param("dynamodb", marks=pytest.mark.aws),
    pytest.param("postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=STORES)
def deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    made = Deployment(request, str(request.param))
    try:
        yield made
    finally:
        made.close()


def chat(client: httpx.Client, session: str, prompt: str, **extra: Any) -> httpx.Response:
    return client.post("/api/v1/chat", json={"session_id": session, "prompt": prompt, **extra})


def listed(client: httpx.Client, **params: Any) -> list[str]:
    response = client.get(SESSIONS, params=params)
    assert response.status_code == 200, response.text
    return [s["session_id"] for s in response.json()["sessions"]]


def test_identities_never_list_read_or_erase_each_others_sessions(deployment: Deployment) -> None:
    with deployment.client("alice") as alice, deployment.client("bob") as bob:
        first = chat(alice, "s1", "hello").json()
        time.sleep(0.01)
        assert chat(alice, "s2", "other").status_code == 200
        time.sleep(0.01)
        assert chat(bob, "s1", "bob's own s1").status_code == 200
        assert listed(alice) == ["s2", "s1"] and listed(bob) == ["s1"]
        assert bob.get(f"{SESSIONS}/s2").status_code == 404  # alice's: as if it did not exist
        assert bob.get(f"{SESSIONS}/s2").json()["error"] == "NOT_FOUND"
        assert bob.get(f"{SESSIONS}/s1").json()["state"] == {"prompts": ["bob's own s1"]}
        assert bob.delete(f"{SESSIONS}/s2").status_code == 204  # erases nothing of alice's
        assert alice.get(f"{SESSIONS}/s2").status_code == 200
        assert alice.delete(f"{SESSIONS}/s1").status_code == 204
        assert alice.get(f"{SESSIONS}/s1").status_code == 404
        assert listed(alice) == ["s2"] and listed(bob) == ["s1"]
        assert bob.get(f"{SESSIONS}/s1").status_code == 200
        assert poll(alice, "s1", first["request_id"], timeout=0.2).status_code == 404
        assert alice.delete(f"{SESSIONS}/s1").status_code == 204  # again: idempotent


def test_show_gives_state_recent_turns_and_last_reply(deployment: Deployment) -> None:
    with deployment.client("alice") as alice:
        ok = chat(alice, "show", "one").json()
        failed = chat(alice, "show", "two", agent="broken")
        assert failed.status_code == 500
        doc = alice.get(f"{SESSIONS}/show").json()
    assert doc["session_id"] == "show" and doc["state"] == {"prompts": ["one"]}
    turns = doc["turns"]
    assert [t["request_id"] for t in turns] == [failed.json()["request_id"], ok["request_id"]]
    assert [(t["status_code"], t["error"]) for t in turns] == [(500, "AGENT_ERROR"), (200, None)]
    assert doc["last_activity_at"] == turns[0]["finished_at"]
    assert doc["last_reply"]["status_code"] == 500
    assert doc["last_reply"]["body"]["error"] == "AGENT_ERROR"


def test_pages_go_through_every_session_once(deployment: Deployment) -> None:
    names = [f"p{i}" for i in range(5)]
    with deployment.client("alice") as alice:
        for name in names:
            assert chat(alice, name, "x").status_code == 200
        seen, cursor = [], None
        for _ in range(5):
            params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
            page = alice.get(SESSIONS, params=params).json()
            assert len(page["sessions"]) <= 2
            seen += [s["session_id"] for s in page["sessions"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
    assert sorted(seen) == names and seen == names[::-1]  # newest first


@pytest.mark.parametrize("kind", STORES[1:])
def test_an_erased_session_leaves_nothing_in_the_store(
    request: pytest.FixtureRequest, kind: str
) -> None:
    made = Deployment(request, kind)
    try:
        with made.client("alice") as alice, made.client("bob") as bob:
            ids = [chat(alice, "gone", "a").json()["request_id"]]
            streamed = alice.post(
                "/api/v1/chat",
                json={"session_id": "gone", "prompt": "one two three", "agent": "words"},
                headers={"Accept": "text/event-stream"},
            )
            assert streamed.status_code == 200 and "three" in streamed.text
            ids.append(alice.get(f"{SESSIONS}/gone").json()["turns"][0]["request_id"])
            kept = chat(bob, "gone", "b").json()["request_id"]
            key = session_key("gone", "key:alice")
            ids += made.open_turns(key)
            before = made.stored()
            assert all(any(i in k for k in before) for i in ids)  # the scan does see them
            assert alice.delete(f"{SESSIONS}/gone").status_code == 204
            after = made.stored()
        assert [k for k in after if key in k or any(i in k for i in ids)] == []
        assert any(kept in k for k in after)  # bob's same-named session is untouched
        if kind == "redis":
            for index in made.redis.scan_iter(match=f"{made.prefix}sessions:*"):
                assert key.encode() not in made.redis.zrange(index, 0, -1)
    finally:
        made.close()


def test_an_erase_during_a_turn_is_not_undone_by_its_commit(deployment: Deployment) -> None:
    with deployment.client("alice") as alice:
        assert chat(alice, "race", "first").status_code == 200
        running = alice.post(
            "/api/v1/chat",
            json={"session_id": "race", "prompt": "slow", "delay": 1.0},
            headers={"Prefer": "respond-async"},
        ).json()
        time.sleep(0.3)  # the turn has read the session and is running
        assert alice.delete(f"{SESSIONS}/race").status_code == 204
        reply = poll(alice, "race", running["request_id"], timeout=10)
        assert reply.status_code == 409 and reply.json()["error"] == "SESSION_DELETED"
        assert alice.get(f"{SESSIONS}/race").status_code == 404  # nothing was written back
        assert "race" not in listed(alice)
        again = chat(alice, "race", "afresh")  # the id can be used again, from nothing
        assert again.json()["result"] == "afresh #1"


def test_without_authentication_the_anonymous_identity_has_the_same_rules(
    request: pytest.FixtureRequest,
) -> None:
    made = Deployment(request, "memory", auth=False)
    try:
        with made.client(None) as anyone:
            assert chat(anyone, "open", "hi").status_code == 200
            assert listed(anyone) == ["open"]
            assert anyone.get(f"{SESSIONS}/open").json()["state"] == {"prompts": ["hi"]}
            assert anyone.get(f"{SESSIONS}/never").status_code == 404
            assert anyone.delete(f"{SESSIONS}/open").status_code == 204
            assert listed(anyone) == []
    finally:
        made.close()


def test_a_credential_is_required_when_authentication_is_on(deployment: Deployment) -> None:
    with deployment.client(None) as nobody:
        for method, path in (
            ("GET", SESSIONS),
            ("GET", f"{SESSIONS}/s"),
            ("DELETE", f"{SESSIONS}/s"),
        ):
            assert nobody.request(method, path).status_code == 401


def _cursor(doc: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


HOSTILE = [
    ("GET", SESSIONS, {"limit": "0"}, "INVALID_REQUEST"),
    ("GET", SESSIONS, {"limit": "101"}, "INVALID_REQUEST"),
    ("GET", SESSIONS, {"limit": "-1"}, "INVALID_REQUEST"),
    ("GET", SESSIONS, {"limit": "9" * 40}, "INVALID_REQUEST"),
    ("GET", SESSIONS, {"limit": "²"}, "INVALID_REQUEST"),
    ("GET", SESSIONS, {"limit": "abc"}, "INVALID_REQUEST"),
    ("GET", SESSIONS, {"cursor": "!!!not-base64"}, "INVALID_CURSOR"),
    ("GET", SESSIONS, {"cursor": "A" * 5000}, "INVALID_CURSOR"),
    ("GET", SESSIONS, {"cursor": _cursor({"at": 1})}, "INVALID_CURSOR"),
    ("GET", SESSIONS, {"cursor": _cursor([1, "a/b"])}, "INVALID_CURSOR"),
    ("GET", SESSIONS, {"cursor": _cursor([-1, "s"])}, "INVALID_CURSOR"),
    ("GET", SESSIONS, {"cursor": _cursor(["1", "s"])}, "INVALID_CURSOR"),
    ("GET", SESSIONS, {"cursor": _cursor([1.5, "s"])}, "INVALID_CURSOR"),
    ("GET", SESSIONS, {"cursor": base64.b64encode(b"\xff\xfe").decode()}, "INVALID_CURSOR"),
    ("GET", f"{SESSIONS}/{'x' * 300}", {}, "INVALID_REQUEST"),
    ("GET", f"{SESSIONS}/a%00b", {}, "INVALID_REQUEST"),
    ("DELETE", f"{SESSIONS}/a%0Ab", {}, "INVALID_REQUEST"),
    ("DELETE", f"{SESSIONS}/{'y' * 300}", {}, "INVALID_REQUEST"),
    ("GET", f"{SESSIONS}/a%2Fb", {}, None),  # decoded to a/b: no such route
]


@pytest.mark.parametrize(("method", "path", "params", "code"), HOSTILE)
def test_hostile_input_gets_a_4xx_json_answer(
    request: pytest.FixtureRequest, method: str, path: str, params: dict[str, str], code: str | None
) -> None:
    made = Deployment(request, "memory")
    try:
        with made.client("alice") as alice:
            response = alice.request(method, path, params=params)
        assert 400 <= response.status_code < 500, response.text
        assert response.headers["content-type"].startswith("application/json")
        if code is not None:
            assert response.json()["error"] == code
    finally:
        made.close()


def test_a_process_that_cannot_read_the_sessions_says_so(request: pytest.FixtureRequest) -> None:
    config: AKConfig = make_config()
    server = Server(IOHandler(config, registry=registry(), with_runner=False))
    try:
        for method in ("GET", "DELETE"):
            response = server.client.request(method, f"{SESSIONS}/s")
            assert response.status_code == 501 and response.json()["error"] == "NOT_SUPPORTED"
        assert server.client.get(SESSIONS).status_code == 501
    finally:
        server.close()


def test_the_routes_and_their_documents_are_in_openapi(deployment: Deployment) -> None:
    with deployment.client("alice") as alice:
        spec = alice.get("/openapi.json").json()
    one = spec["paths"][f"{SESSIONS}/{{session_id}}"]
    assert set(one) == {"get", "delete"} and "204" in one["delete"]["responses"]
    assert "404" in one["get"]["responses"]
    schemas = spec["components"]["schemas"]
    assert {"SessionList", "SessionView", "SessionTurn", "LastReply"} <= set(schemas)
