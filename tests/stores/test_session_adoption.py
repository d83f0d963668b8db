"""Sessions stored before they were scoped per identity are adopted by their owner, and only by
their owner (``session.adopt_unscoped``; issue 24): with the in-memory, Redis and DynamoDB
(moto) stores, and through a real server with API keys (in-memory and Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from agentkernel.auth import qualified_identity
from agentkernel.core.config.auth import AuthConfig
from agentkernel.core.config.stores import SessionConfig
from agentkernel.pipeline.process.io_handler import IOHandler
from agentkernel.pipeline.session_store import SessionStore
from agentkernel.pipeline.session_store.adoption import UnscopedAdoption
from agentkernel.pipeline.session_store.base import SessionRecord, TurnOutcome
from agentkernel.pipeline.session_store.dynamodb import DynamoDBSessionStore
from agentkernel.pipeline.session_store.in_memory import InMemorySessionStore
from agentkernel.pipeline.session_store.redis import RedisSessionStore
from agentkernel.pipeline.wire.scoping import session_key
from tests.api.conftest import Server, make_config, registry
from tests.stores.test_response_stores import create_table

ALICE = "key:alice"
IDP = "https://idp.example/"
JWT_ALICE = qualified_identity("jwt", "alice", IDP)


@pytest.fixture
def prefix() -> str:
    return f"adopt-{uuid.uuid4().hex[:8]}:"


def make_store(request: pytest.FixtureRequest, kind: str, prefix: str) -> SessionStore:
    if kind == "in_memory":
        return InMemorySessionStore()
    if kind == "redis":
        return RedisSessionStore(request.getfixturevalue("redis_url"), prefix=prefix)
    request.getfixturevalue("aws")
    table = f"adopt-{uuid.uuid4().hex[:8]}"
    create_table(table, "session_id")
    return DynamoDBSessionStore(table)


@pytest.fixture(params=["in_memory", "redis", "dynamodb"])
def store(request: pytest.FixtureRequest, prefix: str) -> SessionStore:
    return make_store(request, request.param, prefix)


@pytest.fixture(params=["in_memory", "redis"])
def server_store(request: pytest.FixtureRequest, prefix: str) -> SessionStore:
    return make_store(request, request.param, prefix)


def legacy(store: SessionStore, session_id: str, owner: str | None, turns: int = 2) -> None:
    """A session as stored before scoping: under its bare id, owned by a bare user id."""
    record = SessionRecord(state={"turns": turns}, owner=owner)
    for index in range(turns):
        outcome = TurnOutcome(f"old-{index}", 200, "{}")
        record = store.commit(session_id, record, outcome, {"turns": index + 1})


def read(store: SessionStore, identity: str | None, session_id: str, *schemes: str) -> Any:
    key = session_key(session_id, identity)
    return UnscopedAdoption(store, schemes).read(key, session_id, identity)


def test_the_owner_adopts_its_old_session(store: SessionStore) -> None:
    legacy(store, "s1", "alice")
    adopted = read(store, ALICE, "s1", "key")
    assert adopted.state == {"turns": 2} and adopted.owner == ALICE
    assert adopted.committed == ("old-0", "old-1")
    assert store.read(session_key("s1", ALICE)) == adopted  # copied under the scoped key
    old = store.read("s1")
    assert old.adopted_by == ALICE and old.owner == "alice"  # claimed, still owned
    assert read(store, ALICE, "s1", "key") == adopted  # later turns read the copy


def test_a_turn_commits_on_the_adopted_copy(store: SessionStore) -> None:
    legacy(store, "s1", "alice")
    base = read(store, ALICE, "s1", "key")
    key = session_key("s1", ALICE)
    store.commit(key, base, TurnOutcome("new", 200, "{}"), {"turns": 3})
    assert store.read(key).state == {"turns": 3}
    assert store.read("s1").state == {"turns": 2}  # the old record is left as it was


def test_another_users_session_is_never_adopted(store: SessionStore) -> None:
    legacy(store, "s1", "bob")
    assert read(store, ALICE, "s1", "key") == SessionRecord()
    assert store.read("s1").adopted_by is None
    assert store.read(session_key("s1", ALICE)) == SessionRecord()


def test_a_session_without_an_owner_is_never_adopted(store: SessionStore) -> None:
    legacy(store, "s1", None)  # written with authentication off
    assert read(store, ALICE, "s1", "key") == SessionRecord()


def test_nothing_is_adopted_without_the_setting_or_for_an_unlisted_scheme(
    store: SessionStore,
) -> None:
    legacy(store, "s1", "alice")
    assert read(store, ALICE, "s1") == SessionRecord()
    assert read(store, JWT_ALICE, "s1", "key") == SessionRecord()
    assert read(store, "token:alice", "s1", "key", "jwt") == SessionRecord()
    assert store.read("s1").adopted_by is None


def test_an_adopted_session_is_not_adopted_by_a_second_identity(store: SessionStore) -> None:
    legacy(store, "s1", "alice")  # 'alice' was one namespace for keys and JWTs alike
    assert read(store, ALICE, "s1", "key", "jwt").state == {"turns": 2}
    assert read(store, JWT_ALICE, "s1", "key", "jwt") == SessionRecord()


def test_an_issuer_entry_adopts_for_that_issuer_only(store: SessionStore) -> None:
    entry = JWT_ALICE.rsplit(":", 1)[0]  # jwt:https%3A//idp.example/
    legacy(store, "s1", "alice")
    legacy(store, "s2", "alice")
    other = qualified_identity("jwt", "alice", "https://evil.example/")
    assert read(store, other, "s1", entry) == SessionRecord()
    assert read(store, JWT_ALICE, "s2", entry).state == {"turns": 2}


def test_a_claim_without_its_copy_is_adopted_again_by_the_same_identity(
    store: SessionStore,
) -> None:
    legacy(store, "s1", "alice")
    old = store.read("s1")
    claim = SessionRecord(
        old.state, old.version + 1, old.committed, old.last, owner="alice", adopted_by=ALICE
    )
    store.write("s1", claim, expected_version=old.version)  # as if the copy's write was lost
    assert read(store, "key:mallory", "s1", "key") == SessionRecord()
    assert read(store, ALICE, "s1", "key").state == {"turns": 2}


def test_an_existing_scoped_session_wins(store: SessionStore) -> None:
    legacy(store, "s1", "alice")
    key = session_key("s1", ALICE)
    store.commit(key, SessionRecord(owner=ALICE), TurnOutcome("n", 200, "{}"), {"new": True})
    assert read(store, ALICE, "s1", "key").state == {"new": True}
    assert store.read("s1").adopted_by is None


def test_a_turn_without_an_identity_reads_its_session_as_before(store: SessionStore) -> None:
    legacy(store, "s1", None)
    assert read(store, None, "s1", "key").state == {"turns": 2}


@pytest.mark.parametrize(
    "identity",
    ["alice", "", ":", "key:", ":alice", "key::alice", "key:al%ice", "KEY:alice", "key:alice\n"],
)
def test_odd_identities_adopt_nothing(store: SessionStore, identity: str) -> None:
    legacy(store, "s1", "alice")
    legacy(store, "s1\n", "alice")
    assert read(store, identity, "s1", "key").version == 0
    assert store.read("s1").adopted_by is None


def test_a_user_id_with_escaped_characters_matches_its_old_owner(store: SessionStore) -> None:
    legacy(store, "s1", "a:b%c")
    identity = qualified_identity("key", "a:b%c")  # key:a%3Ab%25c
    assert read(store, identity, "s1", "key").state == {"turns": 2}


@pytest.mark.parametrize(
    "entry", ["", "key:", ":x", "Key", "jwt:a:b", "jwt:has space", "1key", "key\n"]
)
def test_malformed_settings_are_refused(entry: str) -> None:
    with pytest.raises(ValidationError, match="adopt_unscoped"):
        SessionConfig.model_validate({"adopt_unscoped": [entry]})


# -- through a real server: API keys, the runner adopting on a turn's first read ----------------

KEYS = {"alice": "alice-adopt-key-1", "bob": "bob-adopt-key-2"}


@pytest.fixture
def adopting_server(
    server_store: SessionStore, prefix: str, request: pytest.FixtureRequest
) -> Iterator[Server]:
    auth = AuthConfig.model_validate(
        {"enabled": True, "api_keys": [{"user": u, "key": k} for u, k in KEYS.items()]}
    )
    config = make_config(auth=auth)
    session = config.session.model_copy(update={"adopt_unscoped": ["key"]})
    if isinstance(server_store, RedisSessionStore):  # the runner's own store, on the same keys
        session = SessionConfig.model_validate(
            {
                "type": "redis",
                "redis": {"url": request.getfixturevalue("redis_url"), "prefix": prefix},
                "adopt_unscoped": ["key"],
            }
        )
    handler = IOHandler(
        config.model_copy(update={"session": session}), registry=registry(), with_runner=True
    )
    server = Server(handler)
    yield server
    server.close()


def chat(server: Server, user: str, session: str) -> Any:
    body = {"session_id": session, "prompt": "again", "agent": "echo"}
    return server.client.post("/api/v1/chat", json=body, headers={"X-API-Key": KEYS[user]})


def test_an_upgraded_server_continues_the_owners_old_session(
    adopting_server: Server, server_store: SessionStore
) -> None:
    runners = adopting_server.handler.api.stores["session_store"]
    assert isinstance(runners, SessionStore)
    seeded = runners if isinstance(server_store, InMemorySessionStore) else server_store
    old = SessionRecord({"prompts": ["one", "two"]}, version=2, owner="alice")
    seeded.write("legacy-1", old, expected_version=0)  # as the server before the upgrade left it
    bobs = chat(adopting_server, "bob", "legacy-1")  # bob's own, new session of that name
    assert bobs.status_code == 200 and bobs.json()["result"] == "again #1"
    answer = chat(adopting_server, "alice", "legacy-1")
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"] == "again #3"  # two turns before the upgrade, this one
    assert chat(adopting_server, "alice", "legacy-1").json()["result"] == "again #4"
