"""Configuration: ``config.yaml`` plus ``AK_`` environment variables.

Sources, lowest priority first: field defaults, the YAML file (``config.yaml`` in the working
directory, or the path in ``AK_CONFIG_PATH_OVERRIDE``), then environment variables named
``AK_<SECTION>__<KEY>`` with ``__`` between nesting levels (``AK_EXECUTION__QUEUES__BATCH_SIZE``).
All durations are float seconds. An invalid value raises :class:`AKConfigError` naming the key.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from agentkernel.core.config.api import ApiConfig
from agentkernel.core.config.env import describe_unparsable, variable_for
from agentkernel.core.config.execution import ExecutionConfig
from agentkernel.core.config.kafka import share_bookkeeping
from agentkernel.core.config.logs import LoggingConfig
from agentkernel.core.config.stores import SessionConfig
from agentkernel.core.errors import AKConfigError
from agentkernel.core.extras import require_extra
from agentkernel.core.upstream import closest_key, drop_upstream_keys

__all__ = ["AKConfig", "AKConfigError", "describe_block", "require_extra"]

logger = logging.getLogger(__name__)

CONFIG_PATH_ENV = "AK_CONFIG_PATH_OVERRIDE"
DEFAULT_CONFIG_PATH = "config.yaml"


class AKConfig(BaseSettings):
    """The whole configuration; obtain the process-wide instance with :meth:`get`."""

    model_config = SettingsConfigDict(
        env_prefix="AK_", env_nested_delimiter="__", extra="ignore", case_sensitive=False
    )

    execution: ExecutionConfig = Field(default_factory=ExecutionConfig, description="Pipeline.")
    session: SessionConfig = Field(default_factory=SessionConfig, description="Session state.")
    api: ApiConfig = Field(default_factory=ApiConfig, description="HTTP server.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Log output.")

    _instance: ClassVar[AKConfig | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _yaml_path: ClassVar[Path | None] = None

    @model_validator(mode="before")
    @classmethod
    def _read_upstream_files(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = drop_upstream_keys(data)
        for key in data:
            if key not in cls.model_fields:
                near = closest_key(cls, (key,))
                hint = f"; did you mean {near}?" if near else ""
                raise AKConfigError(f"invalid configuration: {key}: unknown key{hint}")
        return data

    @model_validator(mode="after")
    def _warn_about_ignored_bounds(self) -> AKConfig:
        store = self.execution.response_store
        if (store.retry_count or store.delay) and store.type in ("in_memory", "redis"):
            logger.warning(
                "execution.response_store.retry_count/delay are deprecated and have no effect "
                "with the %s store, which pushes replies; api.sync_timeout bounds the wait",
                store.type,
            )
        return self

    @model_validator(mode="after")
    def _share_kafka_bookkeeping(self) -> AKConfig:
        queues, store = self.execution.queues, self.execution.response_store
        share_bookkeeping(queues.kafka, self.session, store)
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if cls._yaml_path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=cls._yaml_path))
        return tuple(sources)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> AKConfig:
        """Build a configuration from the YAML file and the environment.

        Args:
            path: YAML file to read; default ``AK_CONFIG_PATH_OVERRIDE`` or ``./config.yaml``.
                An explicitly named file must exist; the default one is optional.

        Raises:
            AKConfigError: the file is missing or unreadable, or a value is invalid.
        """
        explicit = path or os.environ.get(CONFIG_PATH_ENV)
        yaml_path = Path(explicit or DEFAULT_CONFIG_PATH)
        if explicit and not yaml_path.is_file():
            problem = "is not a file" if yaml_path.exists() else "does not exist"
            raise AKConfigError(
                f"config file '{yaml_path}' {problem} (named by --config or {CONFIG_PATH_ENV})"
            )
        cls._yaml_path = yaml_path if yaml_path.is_file() else None
        try:
            if cls._yaml_path is not None:
                _check_top_level(cls._yaml_path)
            return cls()
        except ValidationError as exc:
            raise AKConfigError(_describe(exc)) from exc
        except SettingsError as exc:  # an AK_ variable that should hold JSON does not
            raise AKConfigError(describe_unparsable(AKConfig, exc)) from exc
        except (ValueError, OSError, yaml.YAMLError) as exc:  # unreadable YAML
            raise AKConfigError(f"{yaml_path}: cannot read configuration: {exc}") from exc
        finally:
            cls._yaml_path = None

    @classmethod
    def get(cls) -> AKConfig:
        """Return the process-wide configuration, loading it on first use."""
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls.load()
            return cls._instance

    @classmethod
    def set(cls, config: AKConfig) -> None:
        """Install ``config`` as the process-wide configuration (embedding, tests)."""
        with cls._lock:
            cls._instance = config

    @classmethod
    def reset(cls) -> None:
        """Forget the process-wide configuration so the next :meth:`get` reloads it."""
        with cls._lock:
            cls._instance = None


def _check_top_level(path: Path) -> None:
    """The file must be a mapping of sections (or empty): a list or a scalar is refused by name.

    Raises:
        AKConfigError: the top level of the file is something else.
    """
    with path.open(encoding="utf-8") as stream:
        doc = yaml.safe_load(stream)
    if doc is not None and not isinstance(doc, dict):
        sections = ", ".join(AKConfig.model_fields)
        kind = "list" if isinstance(doc, list) else type(doc).__name__
        raise AKConfigError(
            f"{path}: the top level must be a mapping of sections ({sections}), not a {kind}"
        )


def _describe(exc: ValidationError) -> str:
    """One line per invalid key, as ``execution.queues.input.no_of_consumers: <reason>``; a key
    an ``AK_`` variable set names the variable."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(part) for part in err["loc"]) or "<root>"
        if variable := variable_for(err["loc"]):
            key = f"{key} (from {variable})"
        reason = _reason(err)
        if err["type"] == "extra_forbidden" and (near := closest_key(AKConfig, err["loc"])):
            reason = f"unknown key; did you mean {near}?"
        lines.append(f"{key}: {reason}")
    return "invalid configuration: " + "; ".join(lines)


def describe_block(exc: ValidationError, path: str) -> str:
    """The errors of a block validated on its own (not through :class:`AKConfig`), each key
    named under ``path``: ``sandbox.queue.type: unknown transport 'x'``."""
    return "; ".join(
        ".".join([path, *(str(part) for part in err["loc"])]) + f": {_reason(err)}"
        for err in exc.errors()
    )


def _reason(err: Any) -> str:
    if err["type"] == "value_error" and "error" in err.get("ctx", {}):
        return str(err["ctx"]["error"])  # our own check's words, without a prefix
    return "unknown key" if err["type"] == "extra_forbidden" else str(err["msg"])
