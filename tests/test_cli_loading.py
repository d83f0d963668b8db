"""Loading the user's code through the installed ``agentkernel`` command, as ``python
agents.py`` would: the file's folder and the working folder are importable."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import httpx
import pytest

from tests.cli_helpers import (
    ECHO_AGENT,
    clean_env,
    one_line_error,
    run,
    start,
    stop,
    wait_healthy,
)
from tests.servers import free_port


def serve_and_ask(cwd: Path, agents: str, *extra: str, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """Serve ``agents`` from ``cwd``, send one turn, return the answer and stop."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(["serve", agents, "--port", str(port), *extra], cwd)
    try:
        wait_healthy(url, proc)
        body = {"session_id": "s", "prompt": "hi"}
        return httpx.post(f"{url}/api/v1/chat", json=body, headers=headers or {}, timeout=20)
    finally:
        stop(proc)


def test_an_agents_file_imports_the_modules_beside_it(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "helper.py").write_text("def reply(turn):\n    return 'helped ' + turn.prompt\n")
    (app / "agents.py").write_text(
        "from helper import reply\n"
        "from agentkernel import Agent, Module\n"
        "Module([Agent('a', reply)])\n"
    )
    answer = serve_and_ask(tmp_path, "app/agents.py")  # before: No module named 'helper'
    assert (answer.status_code, answer.json()["result"]) == (200, "helped hi")


def test_a_dotted_validator_names_a_package_of_the_working_folder(tmp_path: Path) -> None:
    package = tmp_path / "my_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "auth.py").write_text(
        "from agentkernel.auth import AuthValidator, ValidationResult\n"
        "class Door(AuthValidator):\n"
        "    def validate(self, token):\n"
        "        return ValidationResult(token == 'open', {'sub': 'u'}, 'closed')\n"
    )
    (tmp_path / "config.yaml").write_text(
        "api:\n  auth:\n    enabled: true\n    validator: my_package.auth.Door\n"
    )
    (tmp_path / "agents.py").write_text(ECHO_AGENT)
    answer = serve_and_ask(tmp_path, "agents.py", headers={"Authorization": "Bearer open"})
    assert (answer.status_code, answer.json()["result"]) == (200, "echo hi")


def test_the_module_form_loads_the_module_of_the_working_folder(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text(ECHO_AGENT)
    answer = serve_and_ask(tmp_path, "agents")  # not the installed 'agents' package
    assert (answer.status_code, answer.json()["result"]) == (200, "echo hi")


def test_the_module_form_refuses_an_installed_package_that_registers_no_agent(
    tmp_path: Path,
) -> None:
    done = run("serve", "agents", "--port", "0", cwd=tmp_path)
    if importlib.util.find_spec("agents") is None:  # a run without the openai extra
        one_line_error(done, "No module named 'agents'")
        return
    line = one_line_error(done, "registers no")
    # before: it imported the SDK, logged a warning and served 404 for every turn
    assert "site-packages" in line and "no ./agents.py or ./agents/" in line


def test_a_file_without_a_module_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text("from agentkernel import Agent\nx = Agent('a', str)\n")
    done = run("serve", "agents.py", "--port", "0", cwd=tmp_path)  # before: a warning, then 404s
    one_line_error(done, "agents.py registers no agents: create them with Module(")


def test_a_file_named_like_the_package_it_imports_gets_a_hint(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text("from agents import Agent\n")
    one_line_error(run("serve", "agents.py", cwd=tmp_path), "rename the file")


def test_a_missing_file_or_module_is_one_line(tmp_path: Path) -> None:
    one_line_error(run("serve", "nope.py", cwd=tmp_path), "no such file 'nope.py'")
    one_line_error(run("serve", "no_such_module", cwd=tmp_path), "No module named")
    (tmp_path / "broken.py").write_text("def f(:\n")
    one_line_error(run("serve", "broken.py", cwd=tmp_path), "cannot load agents")
    (tmp_path / "attrs.py").write_text("x = 3\n")
    one_line_error(run("serve", "attrs:x", cwd=tmp_path), "is not an Agent")
    one_line_error(run("serve", "attrs:missing", cwd=tmp_path), "missing")


@pytest.mark.nats
@pytest.mark.redis
def test_an_io_process_resolves_dotted_paths_of_the_working_folder(
    tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    (tmp_path / "my_auth.py").write_text(
        "from agentkernel.auth import AuthValidator, ValidationResult\n"
        "class Door(AuthValidator):\n"
        "    def validate(self, token):\n"
        "        return ValidationResult(token == 'open', {'sub': 'u'}, 'closed')\n"
    )
    tag = uuid.uuid4().hex[:8].upper()
    port = free_port()
    env = clean_env(
        AK_API__AUTH__ENABLED="true",
        AK_API__AUTH__VALIDATOR="my_auth.Door",
        AK_EXECUTION__QUEUES__TYPE="nats",
        AK_EXECUTION__QUEUES__NATS__URL=nats_url,
        AK_EXECUTION__QUEUES__NATS__INPUT_STREAM=f"LOAD_IN_{tag}",
        AK_EXECUTION__QUEUES__NATS__INPUT_SUBJECT_PREFIX=f"load{tag}.in",
        AK_EXECUTION__QUEUES__NATS__OUTPUT_STREAM=f"LOAD_OUT_{tag}",
        AK_EXECUTION__QUEUES__NATS__OUTPUT_SUBJECT_PREFIX=f"load{tag}.out",
        AK_EXECUTION__QUEUES__NATS__AUTO_PROVISION="true",
        AK_EXECUTION__RESPONSE_STORE__TYPE="redis",
        AK_EXECUTION__RESPONSE_STORE__REDIS__URL=redis_url,
        AK_EXECUTION__RESPONSE_STORE__REDIS__PREFIX=f"load:{tag}:",
    )
    url = f"http://127.0.0.1:{port}"
    proc = start(["io", "--port", str(port)], tmp_path, env)  # before: cannot import 'my_auth'
    try:
        wait_healthy(url, proc)
        agents = f"{url}/api/v1/agents"
        assert httpx.get(agents, headers={"Authorization": "Bearer open"}).status_code == 200
        assert httpx.get(agents, headers={"Authorization": "Bearer shut"}).status_code == 401
    finally:
        stop(proc)
