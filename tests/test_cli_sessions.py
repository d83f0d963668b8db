"""``agentkernel sessions list|show|delete`` against a real server with two API keys."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from agentkernel.cli.commands import main
from agentkernel.core.config.auth import AuthConfig
from agentkernel.pipeline.process.io_handler import IOHandler
from tests.api.conftest import Server, make_config, registry
from tests.servers import free_port

KEYS = {"alice": "alice-key-5d1e", "bob": "bob-key-77af"}


@pytest.fixture
def server() -> Iterator[Server]:
    auth = AuthConfig(enabled=True, api_keys=[{"user": u, "key": k} for u, k in KEYS.items()])
    made = Server(IOHandler(make_config(auth=auth), registry=registry(), with_runner=True))
    try:
        yield made
    finally:
        made.close()


def sessions(server: Server, who: str, *args: str) -> list[str]:
    return ["sessions", *args, "--url", server.url, "--api-key", KEYS[who]]


def turn(server: Server, who: str, session: str, prompt: str) -> None:
    body = {"session_id": session, "prompt": prompt}
    response = server.client.post("/api/v1/chat", json=body, headers={"X-API-Key": KEYS[who]})
    assert response.status_code == 200, response.text


def test_list_show_and_delete(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    odd = "ü s?1&x"  # quoted in the path: one segment, whatever it holds
    turn(server, "alice", "plain", "one")
    turn(server, "alice", odd, "two")
    turn(server, "bob", "bobs", "three")
    assert main(sessions(server, "alice", "list")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == [odd, "plain"]
    assert main(sessions(server, "alice", "show", odd)) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["state"] == {"prompts": ["two"]} and shown["turns"][0]["status_code"] == 200
    assert main(sessions(server, "bob", "show", odd)) == 1  # alice's: not there for bob
    assert "HTTP 404 NOT_FOUND" in capsys.readouterr().err
    assert main(sessions(server, "alice", "delete", odd)) == 0
    assert capsys.readouterr().out == f"deleted {odd}\n"
    assert main(sessions(server, "alice", "list")) == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == ["plain"]


def test_list_pages(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(3):
        turn(server, "alice", f"p{i}", "x")
    assert main(sessions(server, "alice", "list", "--limit", "2")) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2 and "more: --cursor " in captured.err
    cursor = captured.err.split("--cursor ")[1].strip()
    assert main(sessions(server, "alice", "list", "--limit", "2", "--cursor", cursor)) == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == ["p0"]
    assert main(sessions(server, "alice", "list", "--limit", "1", "--all")) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_refusals_exit_1_with_the_servers_reason(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_key = ["sessions", "list", "--url", server.url, "--api-key", "wrong"]
    assert main(bad_key) == 1
    assert "HTTP 401" in capsys.readouterr().err
    assert main(sessions(server, "alice", "list", "--cursor", "bogus")) == 1
    assert "INVALID_CURSOR" in capsys.readouterr().err
    assert main(sessions(server, "alice", "show", "x" * 300)) == 1
    assert "INVALID_REQUEST" in capsys.readouterr().err


def test_bad_arguments_and_no_server(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["sessions"], ["sessions", "list", "--limit", "101"], ["sessions", "show"]):
        with pytest.raises(SystemExit) as exited:
            main(args)
        assert exited.value.code == 2
    capsys.readouterr()
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["sessions", "delete", "s", "--url", url, "--timeout", "2"]) == 1
    assert "cannot reach the server" in capsys.readouterr().err


def test_sessions_take_the_server_url_from_the_environment_and_check_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentkernel.cli.commands import build_parser

    monkeypatch.setenv("AGENTKERNEL_URL", "http://agents.internal:9000")
    assert build_parser().parse_args(["sessions", "list"]).url == "http://agents.internal:9000"
    with pytest.raises(SystemExit) as refused:  # as for chat: a usage error, exit 2
        build_parser().parse_args(["sessions", "list", "--url", "ftp://x"])
    assert refused.value.code == 2
