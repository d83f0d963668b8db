"""The configuration models of log output (``logging``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentkernel.core.config.base import Block


class LoggerConfig(Block):
    """A logger's settings."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", description="Lowest level logged."
    )


class LoggingConfig(Block):
    """``logging``: log output, applied by the ``agentkernel`` command and, when nothing set up
    logging before, by the container entry points (``ECSIOHandler.run``, ``ECSAgentRunner.run``)."""

    ak: LoggerConfig = Field(
        default_factory=LoggerConfig, description="The agentkernel loggers (``agentkernel.*``)."
    )
    format: Literal["text", "json"] = Field(
        "text",
        description="text: one line per record (time, level, thread, logger, message). json: one "
        "JSON object per line with time, level, logger, thread, message and, when known, "
        "request_id, session_id and trace_id, for a log platform to ingest.",
    )
