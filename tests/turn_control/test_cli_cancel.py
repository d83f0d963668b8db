"""``agentkernel chat --cancel`` and ``--strategy`` against the embedded server."""

from __future__ import annotations

import uuid

import pytest
from tests.api.conftest import Server
from tests.turn_control.helpers import WATCH, post_async, reply

from agentkernel.cli import commands as cli


def last_line(stderr: str) -> str:
    """The CLI's own line (the embedded server logs to the same stream in this process)."""
    return stderr.strip().splitlines()[-1]


def test_chat_cancel_stops_a_running_turn(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    s, prompt = f"s-{uuid.uuid4().hex[:8]}", f"p-{uuid.uuid4().hex}"
    rid = post_async(server.client, s, prompt, agent="long", seconds=30)
    WATCH.wait_started(prompt)
    assert cli.main(["chat", "--session", s, "--cancel", rid, "--url", server.url]) == 0
    assert capsys.readouterr().out.strip() == f"cancelled: {rid}"
    assert reply(server.client, s, rid).json()["error"] == "CANCELLED"
    # Cancelling a turn that answered otherwise is an error, told in one line.
    done = post_async(server.client, s, f"d-{uuid.uuid4().hex}", agent="long", seconds=0)
    assert reply(server.client, s, done).status_code == 200
    assert cli.main(["chat", "--session", s, "--cancel", done, "--url", server.url]) == 1
    assert last_line(capsys.readouterr().err).startswith("agentkernel: ALREADY_FINISHED")
    assert cli.main(["chat", "--session", s, "--cancel", "nope", "--url", server.url]) == 1
    assert last_line(capsys.readouterr().err).startswith("agentkernel: NOT_FOUND")


def test_chat_strategy_is_sent(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    s, prompt = f"s-{uuid.uuid4().hex[:8]}", f"p-{uuid.uuid4().hex}"
    rid = post_async(server.client, s, prompt, agent="long", seconds=1.0)
    WATCH.wait_started(prompt)
    argv = ["chat", "--session", s, "--agent", "long", "--url", server.url, "busy?"]
    assert cli.main([*argv, "--strategy", "reject"]) == 1
    assert "SESSION_BUSY" in last_line(capsys.readouterr().err)
    assert reply(server.client, s, rid).status_code == 200
    with pytest.raises(SystemExit):
        cli.main([*argv, "--strategy", "sometimes"])
