"""Loading the user's code the way ``python agents.py`` would.

The ``agentkernel`` command runs from the virtualenv's ``bin`` folder, so nothing of the user's
project is importable unless we say so. :func:`importable` puts the working folder (and the
folder of an agents file) first on ``sys.path``, as ``python agents.py`` and ``python -m`` do:
an agents file can then import the modules beside it, and the dotted paths in the configuration
(``api.auth.validator``, a custom transport or store) can name packages of the project.

:func:`load_agents` then imports the agents and insists that they registered at least one
agent: a name such as ``agents`` also names an installed package (the OpenAI Agents SDK), and
a process that loaded the wrong one would only answer 404.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from agentkernel.core.agent import Agent, AgentRegistry, Module
from agentkernel.core.errors import AKConfigError

#: What importing a user's module can raise that is the module's fault, not ours.
_LOAD_ERRORS = (OSError, ImportError, AttributeError, SyntaxError, ValueError, TypeError)


def importable(file: Path | None = None) -> None:
    """Put the working folder, and before it the folder of ``file``, first on ``sys.path``."""
    folders = [str(Path.cwd())]
    if file is not None:
        folders.insert(0, str(file.resolve().parent))
    for folder in reversed(folders):
        if folder in sys.path:
            sys.path.remove(folder)
        sys.path.insert(0, folder)


def is_agents_file(spec: str) -> bool:
    """Whether ``spec`` names a file (``agents.py``, ``app/run.py``) rather than a module."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec or Path(spec).is_file()


def load_agents(spec: str, registry: AgentRegistry | None = None) -> None:
    """Import the agents named by ``spec``: a ``.py`` file, or a ``module[:attr]``.

    The file's folder and the working folder are importable first (see :func:`importable`).

    Raises:
        AKConfigError: the file or module cannot be loaded, or it registers no agent.
    """
    registry = registry if registry is not None else AgentRegistry.default()
    before = len(registry.agents())
    try:
        origin = _load_file(spec) if is_agents_file(spec) else _load_module(spec)
    except _LOAD_ERRORS as exc:
        raise AKConfigError(f"cannot load agents from {spec!r}: {_reason(spec, exc)}") from exc
    if len(registry.agents()) == before:
        raise AKConfigError(_registers_nothing(spec, origin))


def _load_file(spec: str) -> str:
    path = Path(spec)
    if path.is_dir():
        raise IsADirectoryError(f"{spec!r} is a folder: name the .py file that creates the Module")
    if not path.is_file():
        raise FileNotFoundError(f"no such file {spec!r} in {Path.cwd()}")
    importable(path)
    runpy.run_path(str(path), run_name="__agentkernel_agents__")
    return str(path)


def _load_module(spec: str) -> str:
    importable()
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    if attr:
        _register(getattr(module, attr))
    return str(getattr(module, "__file__", None) or module_name)


def _register(obj: Any) -> None:
    if isinstance(obj, Agent):
        Module([obj])
    elif isinstance(obj, (list, tuple)) and obj and all(isinstance(a, Agent) for a in obj):
        Module(list(obj))
    elif not isinstance(obj, Module):
        raise AttributeError(f"{obj!r} is not an Agent, a list of agents or a Module")


def _reason(spec: str, exc: BaseException) -> str:
    """The error, with a hint when a file's name hides the installed package it imports."""
    stem = Path(spec.partition(":")[0]).stem
    if isinstance(exc, ImportError) and exc.name == stem and "partially initialized" in str(exc):
        return (
            f"{exc}; the file's name '{stem}' hides the installed package '{stem}' it imports: "
            "rename the file"
        )
    return str(exc)


def _registers_nothing(spec: str, origin: str) -> str:
    if is_agents_file(spec):
        return (
            f"{spec} registers no agents: create them with Module([Agent(...)]) (an "
            "OpenAIModule or LangGraphModule) when the file runs; see docs/agents.md"
        )
    module_name = spec.partition(":")[0]
    top = module_name.split(".")[0]
    local = Path(f"{top}.py").exists() or Path(top).is_dir()
    hint = "" if local else f"; there is no ./{top}.py or ./{top}/ in {Path.cwd()}"
    return (
        f"module {module_name!r} ({origin}) registers no agents{hint}; name your agents file "
        "(agentkernel serve path/to/agents.py) or a module of this folder that creates a Module"
    )
