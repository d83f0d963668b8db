"""Which ``AK_`` environment variable a configuration error came from.

A value set in the environment is invisible in ``config.yaml``, so an error about it names the
variable (``api.port (from AK_API__PORT): ...``). A variable that sets a whole block must hold
JSON; one that does not is named too, instead of pydantic-settings' "error parsing value for
field ... from source EnvSettingsSource".
"""

from __future__ import annotations

import json
import os
import types
import typing
from collections.abc import Sequence

from pydantic import BaseModel

from agentkernel.core.upstream import model_of

PREFIX = "AK_"
NESTING = "__"


def _ak_variables() -> dict[str, str]:
    """``AK_`` variables by upper-case name (the configuration reads them case-insensitively)."""
    return {name.upper(): name for name in os.environ if name.upper().startswith(PREFIX)}


def variable_for(loc: Sequence[object]) -> str | None:
    """The variable that set the key at ``loc`` or a block containing it, if one did."""
    variables = _ak_variables()
    parts = [str(part).upper() for part in loc]
    for end in range(len(parts), 0, -1):
        name = PREFIX + NESTING.join(parts[:end])
        if name in variables:
            return variables[name]
    return None


def unparsable_variables(root: type[BaseModel]) -> list[str]:
    """Variables that set a block (or a mapping, a list) to something that is not JSON."""
    found = []
    for upper, name in sorted(_ak_variables().items()):
        path = upper[len(PREFIX) :].lower().split(NESTING)
        if _is_block(root, path) and not _is_json(os.environ[name]):
            found.append(name)
    return found


def describe_unparsable(root: type[BaseModel], exc: Exception) -> str:
    """The message for pydantic-settings' error about a variable it could not parse as JSON."""
    names = unparsable_variables(root)
    if not names:
        return f"invalid configuration: {exc}"
    return (
        f"invalid configuration: {', '.join(names)}: a variable that sets a whole block must "
        "hold JSON (for one key, name it with __: AK_EXECUTION__QUEUES__TYPE=nats)"
    )


def _is_block(model: type[BaseModel], path: list[str]) -> bool:
    """Whether ``path`` names a field of ``model`` whose value is a block, mapping or list."""
    annotation: object = model
    for part in path:
        block = model_of(annotation)
        if block is None or part not in block.model_fields:
            return False
        annotation = block.model_fields[part].annotation
    return model_of(annotation) is not None or _container(annotation)


def _options(annotation: object) -> tuple[object, ...]:
    """The members of a union (``X | None``), else the annotation alone."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _container(annotation: object) -> bool:
    origins = {typing.get_origin(option) or option for option in _options(annotation)}
    return bool(origins & {dict, list, tuple, set})


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
