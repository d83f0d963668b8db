"""Every AK_* variable a deployment artifact sets is a real configuration key, and the ECS
containers get the queue-mode guide's variables."""

from __future__ import annotations

import re

import pytest

from agentkernel.core.config.root import CONFIG_PATH_ENV, AKConfig
from tests.deploy import artifacts as a

GUIDE_IO = {
    "AK_EXECUTION__QUEUES__INPUT__URL",
    "AK_EXECUTION__QUEUES__OUTPUT__URL",
    "AK_EXECUTION__QUEUES__OUTPUT__NO_OF_CONSUMERS",
    "AK_EXECUTION__QUEUES__BATCH_SIZE",
    "AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME",
}
GUIDE_RUNNER = {
    "AK_EXECUTION__QUEUES__INPUT__URL",
    "AK_EXECUTION__QUEUES__OUTPUT__URL",
    "AK_EXECUTION__QUEUES__INPUT__MAX_RECEIVE_COUNT",
    "AK_EXECUTION__QUEUES__INPUT__NO_OF_CONSUMERS",
    "AK_EXECUTION__QUEUES__BATCH_SIZE",
}


def terraform_variables() -> dict[str, str]:
    """AK_* name -> the literal it is set to, or '' when Terraform computes it."""
    found: dict[str, str] = {}
    directories = [a.SERVERLESS, a.ECS, *sorted(p for p in a.MODULES.iterdir() if p.is_dir())]
    for directory in directories:
        for mapping in a.environment_maps(directory):
            for key, value in mapping.items():
                if key.startswith("AK_"):
                    literal = re.fullmatch(r'"([^"$]*)"', a.expression(value).strip())
                    found[key] = literal.group(1) if literal else found.get(key, "")
    return found


def kubernetes_variables() -> dict[str, str]:
    found: dict[str, str] = {}
    for overlay in a.OVERLAYS:
        for deployment in a.objects(overlay, "Deployment").values():
            for container in deployment["spec"]["template"]["spec"]["containers"]:
                for env in container.get("env", []):
                    if env["name"].startswith("AK_"):  # not libpq's PGPASSWORD, say
                        found[env["name"]] = str(env.get("value", ""))
    return found


def dockerfile_variables() -> dict[str, str]:
    found: dict[str, str] = {}
    for stage in a.dockerfile_stages():
        for instruction, args in stage:
            if instruction == "ENV":
                found.update(dict(re.findall(r"(AK_[A-Z0-9_]+)=(\S+)", args)))
    return found


def every_variable() -> dict[str, str]:
    return {**terraform_variables(), **kubernetes_variables(), **dockerfile_variables()}


def assert_loads(name: str, literal: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path, annotation = a.config_field(name)
    value = literal or a.sample_value(annotation)
    monkeypatch.setenv(name, value)
    loaded = a.resolve(AKConfig.load(), path)
    expected = annotation(value) if annotation in (int, float) else value
    if annotation is bool:
        expected = value.lower() == "true"
    assert loaded == expected, f"{name}={value} loaded as {loaded!r}"
    monkeypatch.delenv(name)


def test_the_artifacts_set_variables_at_all() -> None:
    names = every_variable()
    assert len(terraform_variables()) >= 12
    assert {"AK_API__PORT", "AK_CONFIG_PATH_OVERRIDE"} <= set(names)


def test_every_ak_variable_loads_through_akconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, literal in sorted(every_variable().items()):
        if name == CONFIG_PATH_ENV:
            continue  # not a key: names the YAML file
        assert_loads(name, literal, monkeypatch)


def test_the_check_rejects_a_misspelt_or_unknown_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # AKConfig ignores unknown top-level names, so loading alone would accept these.
    for wrong in ("AK_EXECUTION__QUEUES__INPUT__MAX_RECIEVE_COUNT", "AK_QUEUES__BATCH_SIZE"):
        with pytest.raises(KeyError):
            assert_loads(wrong, "3", monkeypatch)


def test_config_path_points_at_the_mounted_configmap() -> None:
    for overlay in a.OVERLAYS:
        for deployment in a.objects(overlay, "Deployment").values():
            spec = deployment["spec"]["template"]["spec"]
            container = spec["containers"][0]
            env = {e["name"]: e.get("value") for e in container["env"]}
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            assert env[CONFIG_PATH_ENV] == mounts["config"] + "/config.yaml"
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert volumes["config"]["configMap"]["name"].startswith("agentkernel-config")


def ecs_container_variables(local_name: str) -> set[str]:
    text = a.expression(a.locals_of(a.ECS)[local_name])
    queue_mode = text.split(" : ", 1)[0]  # the queue_mode branch of the conditional
    return set(re.findall(r"\b(AK_[A-Z0-9_]+)\s*=", queue_mode))


def test_ecs_io_container_gets_the_guides_variables() -> None:
    session = {"AK_SESSION__TYPE", "AK_SESSION__DYNAMODB__TABLE_NAME"}  # the sessions API
    assert ecs_container_variables("io_environment") == GUIDE_IO | {"AK_API__PORT"} | session


def test_ecs_runner_container_gets_the_guides_variables_and_a_shared_session_store() -> None:
    session = {"AK_SESSION__TYPE", "AK_SESSION__DYNAMODB__TABLE_NAME"}
    health = {"AK_EXECUTION__RUNNER__HEALTH_PORT", "AK_EXECUTION__RUNNER__HEALTH_HOST"}
    assert ecs_container_variables("runner_environment") == GUIDE_RUNNER | session | health


def test_overlay_config_files_load_and_select_the_overlays_broker(tmp_path) -> None:
    for overlay in a.OVERLAYS:
        path = tmp_path / f"{overlay}.yaml"
        path.write_text(a.overlay_config_text(overlay))
        config = AKConfig.load(path)
        assert config.execution.queues.type == overlay
        assert config.execution.response_store.type in {"redis", "dynamodb", "postgres"}
        assert config.session.type == config.execution.response_store.type
