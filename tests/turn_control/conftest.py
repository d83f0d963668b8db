"""An embedded server running the turn-control test agents (:mod:`tests.turn_control.helpers`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.api.conftest import Server, make_config
from tests.turn_control.helpers import registry

from agentkernel.pipeline.process.io_handler import IOHandler


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(**api: Any) -> Server:
        config = make_config(**api)
        handler = IOHandler(config, registry=registry(), with_runner=True)
        servers.append(server := Server(handler))
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def server(serve: Callable[..., Server]) -> Server:
    return serve()
