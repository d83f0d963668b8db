"""AKConfig: YAML + environment, defaults, errors naming the key, and hostile input."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentkernel.core.config.root import AKConfig, AKConfigError, require_extra


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_defaults_match_the_queue_mode_guide() -> None:
    config = AKConfig.load()
    queues = config.execution.queues
    assert queues.type == "in_memory"
    assert (queues.input.no_of_consumers, queues.output.no_of_consumers) == (5, 2)
    assert (queues.input.max_receive_count, queues.output.max_receive_count) == (3, 3)
    assert queues.batch_size is None
    assert config.execution.mode == "rest_sync"


def test_guide_environment_variables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "AK_EXECUTION__QUEUES__INPUT__URL": "https://sqs/in.fifo",
        "AK_EXECUTION__QUEUES__OUTPUT__URL": "https://sqs/out.fifo",
        "AK_EXECUTION__QUEUES__OUTPUT__NO_OF_CONSUMERS": "4",
        "AK_EXECUTION__QUEUES__INPUT__MAX_RECEIVE_COUNT": "2",
        "AK_EXECUTION__QUEUES__INPUT__NO_OF_CONSUMERS": "7",
        "AK_EXECUTION__QUEUES__BATCH_SIZE": "10",
        "AK_EXECUTION__RESPONSE_STORE__DYNAMODB__TABLE_NAME": "responses",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    queues = AKConfig.load().execution.queues
    assert (queues.input.url, queues.output.url) == ("https://sqs/in.fifo", "https://sqs/out.fifo")
    assert (queues.input.no_of_consumers, queues.output.no_of_consumers) == (7, 4)
    assert queues.input.max_receive_count == 2
    assert queues.batch_size == 10
    assert AKConfig.load().execution.response_store.dynamodb.table_name == "responses"  # type: ignore[union-attr]


def test_environment_wins_over_the_file_and_merges_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        tmp_path,
        "execution:\n  queues:\n    input:\n      no_of_consumers: 9\n      max_receive_count: 4\n",
    )
    monkeypatch.setenv("AK_CONFIG_PATH_OVERRIDE", str(path))
    monkeypatch.setenv("AK_EXECUTION__QUEUES__INPUT__NO_OF_CONSUMERS", "2")
    inp = AKConfig.load().execution.queues.input
    assert (inp.no_of_consumers, inp.max_receive_count) == (2, 4)


def test_config_yaml_in_the_working_directory_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "api:\n  port: 9123\n")
    assert AKConfig.load().api.port == 9123


@pytest.mark.parametrize(
    ("env", "key"),
    [
        (
            {"AK_EXECUTION__QUEUES__INPUT__NO_OF_CONSUMERS": "many"},
            "execution.queues.input.no_of_consumers",
        ),
        (
            {"AK_EXECUTION__QUEUES__INPUT__NO_OF_CONSUMERS": "0"},
            "execution.queues.input.no_of_consumers",
        ),
        ({"AK_EXECUTION__QUEUES__BATCH_SIZE": "11"}, "execution.queues.batch_size"),
        ({"AK_EXECUTION__MODE": "turbo"}, "execution.mode"),
        ({"AK_API__PORT": "70000"}, "api.port"),
        ({"AK_EXECUTION__QUEUES__INPUT__TYPO": "1"}, "execution.queues.input.typo"),
    ],
)
def test_invalid_values_name_the_key(
    env: dict[str, str], key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(AKConfigError, match=key.replace(".", r"\.")):
        AKConfig.load()


@pytest.mark.parametrize(
    "text",
    ["execution: [1, 2\n", "- just\n- a list\n", "execution:\n  queues: 7\n", "\x00\x01binary"],
)
def test_malformed_files_fail_with_a_config_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(AKConfigError):
        AKConfig.load(write(tmp_path, text))


def test_a_named_file_that_does_not_exist_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AK_CONFIG_PATH_OVERRIDE", "/nonexistent/config.yaml")
    with pytest.raises(AKConfigError, match="AK_CONFIG_PATH_OVERRIDE"):
        AKConfig.load()


def test_get_caches_until_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    first = AKConfig.get()
    monkeypatch.setenv("AK_API__PORT", "9999")
    assert AKConfig.get() is first
    AKConfig.reset()
    assert AKConfig.get().api.port == 9999


def test_every_field_has_a_description() -> None:
    from pydantic import BaseModel

    missing: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(prefix + name)
            for arg in (*getattr(field.annotation, "__args__", ()), field.annotation):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    walk(arg, f"{prefix}{name}.")

    walk(AKConfig, "")
    assert missing == []


def test_require_extra_names_the_extra() -> None:
    with (
        pytest.raises(ImportError, match=r"pip install 'agentkernel\[nats\]'"),
        require_extra("nats", "execution.queues.type: nats"),
    ):
        import agentkernel_no_such_module  # type: ignore[import-not-found]  # noqa: F401


def test_output_default_survives_a_partial_output_block(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AK_EXECUTION__QUEUES__OUTPUT__URL", "https://sqs/out.fifo")
    monkeypatch.setenv("AK_EXECUTION__QUEUES__INPUT__URL", "https://sqs/in.fifo")
    queues = AKConfig.load().execution.queues
    assert (queues.input.no_of_consumers, queues.output.no_of_consumers) == (5, 2)
