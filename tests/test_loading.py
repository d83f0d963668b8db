"""``load_agents`` and the config helpers of start-up, in process, with malformed input."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentkernel.core.agent import AgentRegistry
from agentkernel.core.config.base import check_kind
from agentkernel.core.config.env import unparsable_variables, variable_for
from agentkernel.core.config.root import AKConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.core.loading import importable, load_agents

AGENT = "from agentkernel import Agent, Module\nModule([Agent({name!r}, str)])\n"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    AgentRegistry.reset()
    yield
    AgentRegistry.reset()


def unique() -> str:
    return f"m_{uuid.uuid4().hex[:10]}"


def test_importable_puts_the_files_folder_then_the_working_folder_first(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    importable(tmp_path / "sub" / "agents.py")
    assert sys.path[:2] == [str(tmp_path / "sub"), str(tmp_path)]
    importable()  # again: moved to the front, not repeated
    assert sys.path[0] == str(tmp_path) and sys.path.count(str(tmp_path)) == 1


def test_a_module_of_the_working_folder_with_an_attribute(tmp_path: Path) -> None:
    name = unique()
    (tmp_path / f"{name}.py").write_text(
        "from agentkernel import Agent\none = Agent('one', str)\nmany = [Agent('two', str)]\n"
    )
    load_agents(f"{name}:one")
    load_agents(f"{name}:many")
    assert [a.name for a in AgentRegistry.default().agents()] == ["one", "two"]


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        ("", "cannot load agents from ''"),
        (":", "cannot load agents from ':'"),
        ("a:b:c", "No module named 'a'"),
        ("missing.py", "no such file 'missing.py'"),
        ("../../../etc/passwd", "no such file '../../../etc/passwd'"),
        ("/etc/passwd", "cannot load agents from '/etc/passwd'"),
        ("sub/", "'sub/' is a folder"),
        ("sub", "module 'sub' (sub) registers no agents; name your agents file"),
        ("os:sep", "is not an Agent"),
        ("os:nope", "has no attribute 'nope'"),
        ("\x00.py", "cannot load agents"),
    ],
)
def test_malformed_specs_are_config_errors(tmp_path: Path, spec: str, text: str) -> None:
    (tmp_path / "sub").mkdir()
    with pytest.raises(AKConfigError, match=None) as caught:
        load_agents(spec)
    assert text in str(caught.value)


def test_an_empty_list_or_a_module_without_agents_registers_nothing(tmp_path: Path) -> None:
    name = unique()
    (tmp_path / f"{name}.py").write_text("nothing = []\n")
    with pytest.raises(AKConfigError, match="is not an Agent"):
        load_agents(f"{name}:nothing")
    with pytest.raises(AKConfigError, match=f"module '{name}' .* registers no agents"):
        load_agents(name)


def test_a_file_that_raises_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("raise ValueError('no key set')\n")
    with pytest.raises(AKConfigError, match="no key set"):
        load_agents("bad.py")


def test_loading_into_a_given_registry(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text(AGENT.format(name="x"))
    load_agents("agents.py", AgentRegistry.default())
    assert [a.name for a in AgentRegistry.default().agents()] == ["x"]


@pytest.mark.parametrize("kind", ["", ".", "..", "rabbit", " nats"])
def test_check_kind_refuses_what_is_neither_builtin_nor_dotted(kind: str) -> None:
    with pytest.raises(ValueError, match="unknown transport"):
        check_kind(kind, ("nats",), "transport")


def test_check_kind_accepts_builtins_and_dotted_paths() -> None:
    assert check_kind("nats", ("nats",), "transport") == "nats"
    assert check_kind("pkg.mod.Class", ("nats",), "transport") == "pkg.mod.Class"


def test_variable_for_finds_the_variable_of_a_key_or_its_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("Ak_Execution__Queues", "{}")
    monkeypatch.setenv("AK_API__PORT", "x")
    assert variable_for(("api", "port")) == "AK_API__PORT"
    assert variable_for(("execution", "queues", "input", "url")) == "Ak_Execution__Queues"
    assert variable_for(("session", "ttl")) is None
    assert variable_for(()) is None


def test_unparsable_variables_names_only_blocks_that_are_not_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AK_EXECUTION__QUEUES__INPUT", "url=x")  # a block, not JSON
    monkeypatch.setenv("AK_EXECUTION__QUEUES__KAFKA__CLIENT_CONFIG", "{}")  # a mapping, JSON
    monkeypatch.setenv("AK_API__PORT", "eighty")  # a scalar: pydantic's business
    monkeypatch.setenv("AK_NO__SUCH__KEY", "[")  # unknown: ignored
    assert unparsable_variables(AKConfig) == ["AK_EXECUTION__QUEUES__INPUT"]
