"""The configuration models of the pipeline between the API and the agents (``execution``).

All durations are float seconds.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from agentkernel.core.config.base import Block
from agentkernel.core.config.queues import QueuesConfig
from agentkernel.core.config.rules import check_reply_ttl
from agentkernel.core.config.stores import ResponseStoreConfig
from agentkernel.core.config.turns import TurnControlConfig

#: Turns one runner process keeps in flight by default on a broker, where each holds a lease.
BROKER_MAX_IN_FLIGHT = 256
#: The same on the in-memory transport (``agentkernel serve``), where no turn holds a lease.
IN_PROCESS_MAX_IN_FLIGHT = 10_000


class RunnerConfig(Block):
    """``execution.runner``: how an Agent Runner process executes turns."""

    max_in_flight: int | None = Field(
        None,
        ge=1,
        description="Turns one runner process keeps running at once (asyncio), across all its "
        "consumer threads; independent of no_of_consumers. Unset: 256 on a broker, where each "
        "turn in flight holds a lease the broker must track; 10000 on the in-memory transport "
        "(agentkernel serve), where a turn waits in the process's memory whether it runs or "
        "not: about 3 KB queued, 12 KB running, besides what its agent holds.",
    )
    lease_extension: bool = Field(
        True,
        description="Extend the message lease (visibility timeout, ack wait) while a turn runs, "
        "so a long turn is not delivered twice.",
    )
    turn_timeout: float | None = Field(
        None,
        gt=0,
        description="Seconds a turn may run before it is cancelled and answered 504 "
        "TURN_TIMEOUT (not retried); an Agent's own timeout wins. Unset: no limit.",
    )
    stall_warning: float | None = Field(
        0.1,
        gt=0,
        description="Warn (naming the agent and request) when code running on the runner's event "
        "loop blocks it longer than this many seconds; async agents must not block. Unset: off.",
    )
    isolate_last_attempt: bool = Field(
        True,
        description="Run a turn on its last allowed delivery alone in its runner process, so a "
        "turn that crashes the process (a poison turn) cannot use up the deliveries of turns "
        "that were only running beside it.",
    )
    drain_timeout: float = Field(
        20.0,
        gt=0,
        description="Seconds a stopping runner waits for its turns in flight (and, embedded, the "
        "turns still queued) to finish. Turns still unfinished are logged by request id and "
        "handed back to the broker for another runner.",
    )
    health_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="TCP port on which a runner process (agentkernel runner, "
        "ECSAgentRunner.run) answers GET /health, /ready and /metrics (Prometheus text). Unset: "
        "no port. The container recipes set 8001.",
    )
    health_host: str = Field(
        "127.0.0.1",
        description="Interface of the runner's health port; 0.0.0.0 in a container, so probes "
        "and scrapers reach it.",
    )

    def in_flight_limit(self, queues_in_process: bool) -> int:
        """``max_in_flight``, or when it is unset the default for where the queues live.

        Args:
            queues_in_process: the transport keeps its queues in this process (in-memory).
        """
        if self.max_in_flight is not None:
            return self.max_in_flight
        return IN_PROCESS_MAX_IN_FLIGHT if queues_in_process else BROKER_MAX_IN_FLIGHT


class ExecutionMode(StrEnum):
    """The values of ``execution.mode``, by the names upstream code compares them with.

    The setting itself stays a plain string (``config.execution.mode == "rest_async"``); a member
    equals its value, so ``mode == ExecutionMode.REST_ASYNC`` holds as well, and a member may be
    assigned where the setting is built.
    """

    REST_SYNC = "rest_sync"
    REST_ASYNC = "rest_async"
    ASYNC = "async"
    STREAM = "stream"


class ExecutionConfig(Block):
    """``execution``: the pipeline between the API and the agents."""

    mode: Literal["rest_sync", "rest_async", "async", "stream"] = Field(
        "rest_sync",
        description="Default reply mode of POST /api/v1/chat: rest_sync waits for the reply, "
        "rest_async answers 202 at once. A client can ask for async per request with "
        "'Prefer: respond-async'. async and stream are the serverless WebSocket modes (replies "
        "pushed to the connection; stream pushes chunks); a REST POST answers 202 in them.",
    )
    queues: QueuesConfig = Field(default_factory=QueuesConfig, description="Queue transport.")
    response_store: ResponseStoreConfig = Field(
        default_factory=ResponseStoreConfig, description="Reply store."
    )
    runner: RunnerConfig = Field(default_factory=RunnerConfig, description="Agent Runner tuning.")
    turn_control: TurnControlConfig = Field(
        default_factory=TurnControlConfig, description="Cancelling turns, multitask strategies."
    )

    @model_validator(mode="after")
    def _replies_outlive_the_dedup_window(self) -> ExecutionConfig:
        check_reply_ttl(self.queues, self.response_store)
        return self
