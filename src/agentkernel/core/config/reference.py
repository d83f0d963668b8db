"""Render the configuration reference (``docs/configuration.md``) from the settings models.

Run ``python -m agentkernel.core.config.reference > docs/configuration.md`` after changing a
field; a test fails when the committed page is out of date.
"""

from __future__ import annotations

import enum
import json
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from agentkernel.core.config.root import AKConfig
from agentkernel.core.upstream import UPSTREAM_MOVED, UPSTREAM_ONLY
from agentkernel.core.upstream import model_of as _model_of

HEADER = """# Configuration reference

Settings come from an optional `config.yaml` (in the working directory, or the file named by
`AK_CONFIG_PATH_OVERRIDE`) and from environment variables, which win. A key `a.b.c` is the
variable `AK_A__B__C` (upper case, `__` between levels), e.g.
`execution.queues.input.no_of_consumers` is `AK_EXECUTION__QUEUES__INPUT__NO_OF_CONSUMERS`.
Durations are seconds (floats). An invalid value stops start-up with an `AKConfigError` that names
the key; an unknown key is an error that names the closest valid one. Blocks marked *optional
block* are absent until a key inside them is set.

`config.yaml` files written for the upstream agentkernel queue mode load as they are. Keys of
upstream features this package does not have are ignored with one warning each: {ignored}.
Upstream keeps some settings in a backend block that live one level up here; they are read there
(with a warning) unless that key is set too: {moved}. A `valkey` store type and block (response
store or session) are read as `redis` (Valkey speaks the Redis protocol; `valkey://` URLs become
`redis://`).

| Key | Type | Default | Description |
|---|---|---|---|
"""


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return f"Literal{[member.value for member in annotation]}"
    text = str(annotation).replace("typing.", "").replace("NoneType", "None")
    return text.replace("<class '", "").replace("'>", "")


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        return "" if isinstance(value, BaseModel) else json.dumps(value)
    if field.default is PydanticUndefined or field.default is None:
        return ""
    return json.dumps(field.default)


def rows(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Table rows for every field of ``model``, depth first."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        key = prefix + name
        nested = _model_of(field.annotation)
        if nested is not None:
            note = " (*optional block*)" if field.default is None else ""
            out.append(f"| `{key}` | block | | {field.description}{note} |")
            out.extend(rows(nested, key + "."))
            continue
        kind = _type_name(field.annotation)
        out.append(f"| `{key}` | `{kind}` | `{_default(field)}` | {field.description} |")
    return out


def render() -> str:
    """The whole reference page."""
    ignored = ", ".join(f"`{'.'.join(path)}`" for path in UPSTREAM_ONLY)
    moved = ", ".join(
        f"`{'.'.join(path)}` as `{'.'.join(target)}`" for path, target in UPSTREAM_MOVED.items()
    )
    header = HEADER.format(ignored=ignored, moved=moved)
    return header + "\n".join(rows(AKConfig)) + "\n"


if __name__ == "__main__":
    print(render(), end="")
