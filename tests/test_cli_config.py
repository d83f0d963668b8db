"""Configuration mistakes at start: one line naming the key (or the ``AK_`` variable that set
it), exit 2, before the start-up summary; split processes refuse per-process stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_helpers import ECHO_AGENT, clean_env, one_line_error, run


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    (tmp_path / "agents.py").write_text(ECHO_AGENT)
    return tmp_path


def nats_env(**extra: str) -> dict[str, str]:
    return clean_env(AK_EXECUTION__QUEUES__TYPE="nats", **extra)


def test_a_runner_refuses_an_in_memory_session_store(agents: Path) -> None:
    env = nats_env(AK_SESSION__TYPE="in_memory")
    done = run("runner", "agents.py", cwd=agents, env=env)  # before: started cleanly
    line = one_line_error(done, "session.type: 'agentkernel runner' needs a session store shared")
    assert "(redis, dynamodb), but it is in_memory" in line


def test_an_io_process_refuses_an_in_memory_response_store(agents: Path) -> None:
    done = run("io", cwd=agents, env=nats_env())
    one_line_error(
        done, "execution.response_store.type: 'agentkernel io' needs a response store shared"
    )


def test_serve_keeps_in_memory_stores_on_a_broker(agents: Path) -> None:
    env = nats_env(AK_EXECUTION__QUEUES__NATS__URL="nats://127.0.0.1:1")
    done = run("serve", "agents.py", "--port", "0", cwd=agents, env=env)
    one_line_error(done, "cannot reach the NATS server")  # got past the store refusal


def test_a_yaml_list_at_the_top_level(agents: Path) -> None:
    (agents / "config.yaml").write_text("- execution\n- api\n")
    done = run("serve", "agents.py", cwd=agents)
    one_line_error(done, "config.yaml: the top level must be a mapping of sections")
    (agents / "config.yaml").write_text("just text\n")
    one_line_error(run("serve", "agents.py", cwd=agents), "not a str")


def test_an_empty_config_file_is_the_defaults(agents: Path) -> None:
    (agents / "config.yaml").write_text("# nothing yet\n")
    done = run("serve", "agents.py", "--port", "99999", cwd=agents)
    assert done.returncode == 2 and "is not a port" in done.stderr  # parsed past the file


def test_an_invalid_value_from_the_environment_names_the_variable(agents: Path) -> None:
    done = run("serve", "agents.py", cwd=agents, env=clean_env(AK_API__PORT="eighty"))
    one_line_error(done, "api.port (from AK_API__PORT): ")
    lower = clean_env(ak_api__sync_timeout="-1")
    one_line_error(run("serve", "agents.py", cwd=agents, env=lower), "(from ak_api__sync_timeout)")


def test_a_block_variable_that_is_not_json_is_named(agents: Path) -> None:
    env = clean_env(AK_EXECUTION__QUEUES__INPUT="no_of_consumers=3")
    done = run("serve", "agents.py", cwd=agents, env=env)
    # before: "config.yaml: cannot read configuration: error parsing value for field ..."
    line = one_line_error(done, "AK_EXECUTION__QUEUES__INPUT: a variable that sets a whole block")
    assert "config.yaml" not in line


def test_an_unknown_backend_type_fails_before_the_summary(agents: Path) -> None:
    cases = {
        "AK_EXECUTION__QUEUES__TYPE": "unknown transport 'rabbit'",
        "AK_EXECUTION__RESPONSE_STORE__TYPE": "unknown response store 'rabbit'",
        "AK_SESSION__TYPE": "unknown session store 'rabbit'",
    }
    for variable, text in cases.items():
        done = run("serve", "agents.py", cwd=agents, env=clean_env(**{variable: "rabbit"}))
        one_line_error(done, text)
        assert "agentkernel.cli" not in done.stderr  # before: the summary line, then the error
